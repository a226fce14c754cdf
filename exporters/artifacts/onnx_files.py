"""ONNX with this project's conventions: a torch module exported to ONNX bytes, and the external-data
confinement check of an ONNX file.

The leaf below every exporter: the model exporter (``onnx_export``), the source loaders
(``exporters.sources``), pipeline stages and the text encoder all write and check ONNX the same way
through these functions, and none of them needs to know about the others. Exports are produced in
memory and written by the caller, whole (``python_backend.atomic_files``): a full disk then fails one
write of known size with a clear error, not a library's half-written file.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import onnx
import torch
from torch import nn

from exporters.errors import ExportCheckError

OPSET = 17


def check_external_data(model_path: Path, model: onnx.ModelProto | None = None) -> None:
    """Reject ONNX initializers stored outside the model's own folder (path traversal on load).

    ``model``: the file already loaded without its external data (read from ``model_path`` if None).
    """
    model = model if model is not None else onnx.load(str(model_path), load_external_data=False)
    root = model_path.parent.resolve()
    for tensor in model.graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        target = (root / location).resolve()
        if Path(location).is_absolute() or not target.is_relative_to(root):
            raise ExportCheckError(
                f"{model_path}: initializer {tensor.name!r} points outside the model folder: {location!r}"
            )


def module_to_onnx(
    module: nn.Module,
    example: tuple[torch.Tensor, ...],
    input_names: list[str],
    output_names: list[str],
    variable_axes: dict[str, dict[int, str]] | None = None,
) -> bytes:
    """``torch.onnx.export`` with this project's conventions: the given tensor names, a dynamic batch
    axis on every tensor (plus ``variable_axes``), ``OPSET``, the TorchScript-based exporter; the ONNX
    file's bytes. Used for models, pipeline stages and the text encoder."""
    axes = {
        name: {0: "batch", **(variable_axes or {}).get(name, {})} for name in [*input_names, *output_names]
    }
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            example,
            buffer,
            input_names=input_names,
            output_names=output_names,
            dynamic_axes=axes,
            opset_version=OPSET,
            dynamo=False,
        )
    return buffer.getvalue()
