"""ONNX with this project's conventions, for every exporter: a torch module as ONNX bytes (made in
memory, so the caller's whole-file write fails cleanly on a full disk), the external-data check, and
onnxruntime's refusals of a shape in one line naming the model, the shape and the fix (a file states
that an axis is variable, not which lengths it takes: a UNet runs only at multiples of 32)."""

from __future__ import annotations

import io
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state
from torch import nn

from exporters.errors import ExportCheckError, SpecError

OPSET = 17
# What onnxruntime raises when a graph cannot run on the inputs it was given.
ORT_ERRORS = (ort_state.Fail, ort_state.InvalidArgument, ort_state.NotImplemented, ort_state.RuntimeException)
LENGTHS_FIX = (
    "if the model takes only some lengths (a UNet-like model: multiples of 2**halvings), list them under "
    "lengths: and make max_shape one of them (`exporters init` finds them for an ONNX file)"
)


def check_external_data(model_path: Path, model: onnx.ModelProto | None = None) -> None:
    """Reject ONNX initializers stored outside the model's own folder (path traversal on load)."""
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


def ort_reason(error: BaseException) -> str:
    """onnxruntime's message without its C++ source location: the node and what went wrong."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    node = re.search(r"running (\w+) node\. Name:'([^']*)'", text)
    message = text.partition("Status Message: ")[2] or text
    message = re.sub(r"^\S+\.(?:h|cc):\d+ .*? was false\. ", "", message)
    message = re.sub(r"^\S+\.(?:h|cc):\d+ ", "", message)
    return f"{node[1]} node {node[2]!r}: {message}" if node else message


def shapes_text(feed: Mapping[str, np.ndarray]) -> str:
    """``name [1, 3, 250, 250], ...``: the shapes a run was given."""
    return ", ".join(f"{name} {list(array.shape)}" for name, array in feed.items())


def run_or_explain(
    session: Any, names: list[str] | None, feed: dict[str, np.ndarray], model: str, what: str
) -> list:
    """``session.run(names, feed)``; onnxruntime's refusal as a ``SpecError`` on ``<model>.lengths``
    naming the shapes, ``what`` was run (the warm-up, drawn inputs), the reason and the fix."""
    try:
        return session.run(names, feed)
    except ORT_ERRORS as error:
        raise SpecError(
            f"{model}.lengths",
            f"onnxruntime cannot run the model at {shapes_text(feed)} ({what}): {ort_reason(error)}; "
            + LENGTHS_FIX,
        ) from None
