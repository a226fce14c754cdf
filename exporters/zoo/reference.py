"""The torch side of every check: a spec's torch model (a zoo entry with its seeded weights, or the
module of the user's own source), valid inputs for it, and its fp32 answer, the truth every exported
artifact and every served answer is held to.

Kept beside the zoo (not in ``onnx_export``) so that whoever needs the reference (the client's
``--check``, perf's input pools, the pipeline builder) imports torch and the zoo, but not onnx or
onnxruntime unless the spec's source needs them; and so that nothing imports torch merely to talk to a
server.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from exporters.errors import ExportCheckError
from exporters.inputs import draw_inputs, widen
from exporters.spec import ModelSpec
from exporters.zoo import ZOO


def build_torch_model(spec: ModelSpec) -> nn.Module:
    """The spec's torch model in fp32 (the reference for every precision): the zoo entry with its
    seeded weights, or the module of the user's factory, ``.pt2`` program or Hugging Face folder."""
    if spec.source_kind == "zoo":
        return ZOO[spec.source].create(spec.options, spec.seed)
    from exporters.sources.load import load_source

    module = getattr(load_source(spec), "module", None)
    if module is None:
        raise ExportCheckError(f"{spec.name}: a {spec.source_kind} source has no torch module")
    return module


def sample_inputs(spec: ModelSpec, model: Any, batch: int, seed: int) -> list[np.ndarray]:
    """Valid inputs for ``spec`` at ``batch`` (``exporters.inputs.draw_inputs``, the one place inputs
    come from; ``model`` is the zoo model where the zoo samples, else unused)."""
    return draw_inputs(spec, batch, seed, model)


def torch_reference(model: nn.Module, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Run the fp32 torch model (float inputs widened to fp32); the truth every artifact is held to."""
    tensors = [torch.from_numpy(widen(a)) for a in inputs]
    with torch.inference_mode():
        outputs = model(*tensors)
    outputs = outputs if isinstance(outputs, tuple | list) else (outputs,)
    return [o.float().numpy() for o in outputs]
