"""The torch side of every check: a spec's zoo model with its seeded weights, valid inputs for it, and
its fp32 answer, the truth every exported artifact and every served answer is held to.

Kept beside the zoo (not in ``onnx_export``) so that whoever needs the reference (the client's
``--check``, perf's input pools, the pipeline builder) imports torch and the zoo, but not onnx or
onnxruntime; and so that nothing imports torch merely to talk to a server.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from exporters.spec import ModelSpec
from exporters.zoo import ZOO
from python_backend.dtypes import DTYPES


def build_torch_model(spec: ModelSpec) -> nn.Module:
    """The spec's zoo model with its seeded weights, in fp32 (the reference for every precision)."""
    return ZOO[spec.source].create(spec.options, spec.seed)


def sample_inputs(spec: ModelSpec, model: nn.Module, batch: int, seed: int) -> list[np.ndarray]:
    """Valid inputs for ``spec`` at ``batch``, cast to the spec's dtypes (fp16 models take fp16)."""
    arrays = ZOO[spec.source].sample(model, spec.options, batch, np.random.default_rng(seed))
    return [a.astype(DTYPES[t.dtype].numpy_dtype()) for a, t in zip(arrays, spec.inputs, strict=True)]


def torch_reference(model: nn.Module, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Run the fp32 torch model (float inputs widened to fp32); the truth every artifact is held to."""
    tensors = [torch.from_numpy(a.astype(np.float32) if a.dtype == np.float16 else a) for a in inputs]
    with torch.inference_mode():
        outputs = model(*tensors)
    outputs = outputs if isinstance(outputs, tuple | list) else (outputs,)
    return [o.float().numpy() for o in outputs]
