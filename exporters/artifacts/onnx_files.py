"""ONNX with this project's conventions, for every exporter: a torch module as ONNX bytes (made in
memory, so the caller's whole-file write fails cleanly on a full disk) and the external-data check."""

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
    """Reject ONNX initializers stored outside the model's own folder (path traversal on load);
    ``model``: the file already loaded without its external data."""
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
    module: nn.Module, example: tuple[torch.Tensor, ...], input_names: list[str], output_names: list[str],
    variable_axes: dict[str, dict[int, str]] | None = None,
) -> bytes:  # fmt: skip
    """``torch.onnx.export`` with the given tensor names, a dynamic batch axis on every tensor (plus
    ``variable_axes``) and the TorchScript-based exporter (exact names, fast)."""
    axes = {
        name: {0: "batch", **(variable_axes or {}).get(name, {})} for name in [*input_names, *output_names]
    }
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module, example, buffer, input_names=input_names, output_names=output_names, dynamic_axes=axes,
            opset_version=OPSET, dynamo=False,
        )  # fmt: skip
    return buffer.getvalue()
