"""The one interface every source offers the exporter, and the torch-module source behind most of them."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from exporters.artifacts.onnx_files import module_to_onnx
from exporters.artifacts.torch_reference import torch_reference
from exporters.errors import SpecError
from exporters.schema.models import ModelSpec
from exporters.schema.sections import INTEGER_DTYPES, VARIABLE
from exporters.sources.inputs import draw_inputs


def check_output_shapes(spec: ModelSpec, outputs: list[np.ndarray], what: str) -> None:
    """The spec's outputs must match what the model gives (count, and shape: -1 within max_shape)."""
    if len(outputs) != len(spec.outputs):
        raise SpecError(
            f"{spec.name}.outputs", f"lists {len(spec.outputs)} outputs, {what} gives {len(outputs)}"
        )
    for index, (array, tensor) in enumerate(zip(outputs, spec.outputs, strict=True)):
        if not tensor.admits(array.shape[1:]):
            bound = f" (max_shape {list(tensor.largest)})" if tensor.variable else ""
            raise SpecError(
                f"{spec.name}.outputs[{index}].shape",
                f"is {list(tensor.shape)}{bound}, {what} gives {list(array.shape[1:])}",
            )


class LoadedSource:
    """A model of the spec, loaded and ready to be checked and exported. Each kind gives ``reference``
    (the fp32 truth for inputs, floats widened to fp32), ``fold_identity`` (what determines the artifact
    into a digest: weights, files, user code) and ``onnx_bytes`` (the file to serve, in the spec's
    precision); ``conversion``: how a conversion made before anything else saw the source matched it."""

    def __init__(self, spec: ModelSpec, zoo_model: nn.Module | None = None) -> None:
        self.spec, self.zoo_model = spec, zoo_model
        self.conversion: dict[str, Any] = {}

    def inputs(self, batch: int, seed: int) -> list[np.ndarray]:
        return draw_inputs(self.spec, batch, seed, self.zoo_model)

    def check_signature(self) -> None:
        check_output_shapes(self.spec, self.reference(self.inputs(2, seed=0)), "the model")


class TorchModuleSource(LoadedSource):
    """An ``nn.Module`` (zoo, user factory, Hugging Face), exported with the spec's tensor names."""

    def __init__(self, spec: ModelSpec, module: nn.Module, files: list[Path] | None = None) -> None:
        super().__init__(spec, module if spec.source_kind == "zoo" else None)
        self.module = module
        self.files = files or []

    def reference(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        return torch_reference(self.module, inputs)

    def check_signature(self) -> None:
        """As for every source; a ``forward`` failing on the spec's inputs is a one-line spec error."""
        inputs = self.inputs(2, seed=0)
        try:
            outputs = self.reference(inputs)
        except Exception as error:  # the user's forward may raise anything
            raise forward_failure(self.spec, inputs, error, self.module) from error
        check_output_shapes(self.spec, outputs, "the model")
        for index, (array, tensor) in enumerate(zip(outputs, self.spec.outputs, strict=True)):
            floats = array.dtype.kind == "f"
            if floats != (tensor.dtype not in INTEGER_DTYPES):
                raise SpecError(
                    f"{self.spec.name}.outputs[{index}].dtype",
                    f"is {tensor.dtype}, the model gives {array.dtype} for {tensor.name!r}; "
                    f"write dtype: {'fp32' if floats else 'int64'}",
                )

    def fold_identity(self, digest: Any) -> None:
        for file in self.files:
            digest.update(file.name.encode())
            digest.update(file.read_bytes())
        for name, tensor in self.module.state_dict().items():
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())

    def onnx_bytes(self) -> bytes:
        # A copy: halving in place would round the reference model's weights too.
        module = copy.deepcopy(self.module).half() if self.spec.precision == "fp16" else self.module
        example = tuple(torch.from_numpy(a) for a in self.inputs(2, seed=0))
        return module_to_onnx(
            module, example, [t.name for t in self.spec.inputs], [t.name for t in self.spec.outputs],
            variable_axes=variable_axes(self.spec),
        )  # fmt: skip


def forward_failure(
    spec: ModelSpec, inputs: list[np.ndarray], error: Exception, module: nn.Module
) -> SpecError:
    """Why ``forward`` failed, in one line: what was given, the weights' dtypes, torch's first line and the
    fix; ``inputs[i].dtype`` when torch complains of a dtype and one input alone is integer."""
    text = str(error).strip()
    integers = [i for i, t in enumerate(spec.inputs) if t.dtype in INTEGER_DTYPES]
    floats = all(p.dtype.is_floating_point for p in module.parameters())
    of_dtype = "dtype" in text.lower() or "scalar type" in text.lower()
    field = f"inputs[{integers[0]}].dtype" if of_dtype and floats and len(integers) == 1 else "inputs"
    given = ", ".join(
        f"{t.name}: {t.dtype} {list(a.shape)}" for t, a in zip(spec.inputs, inputs, strict=True)
    )
    weights = sorted({str(p.dtype).removeprefix("torch.") for p in module.parameters()})
    held = f"; its weights are {', '.join(weights)}" if weights else ""
    return SpecError(
        f"{spec.name}.{field}",
        f"the model's forward fails on the inputs the spec declares ({given}){held}: "
        f"{type(error).__name__}: {text.splitlines()[0] if text else ''}; give each input the dtype and "
        "shape forward takes",
    )


def variable_axes(spec: ModelSpec) -> dict[str, dict[int, str]]:
    """ONNX dynamic axes beyond the batch: ``{tensor: {axis: name}}`` for every -1 of the spec."""
    return {
        t.name: {axis + 1: f"{t.name}_dim{axis + 1}" for axis, d in enumerate(t.shape) if d == VARIABLE}
        for t in (*spec.inputs, *spec.outputs)
        if t.variable
    }
