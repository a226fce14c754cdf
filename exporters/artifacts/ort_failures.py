"""onnxruntime's refusals of a shape, in one line that names the model, the shape and the fix: a file
states that an axis is variable, not which lengths it takes (a UNet runs only at multiples of 32)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

from exporters.errors import SpecError

# What onnxruntime raises when a graph cannot run on the inputs it was given.
ORT_ERRORS = (ort_state.Fail, ort_state.InvalidArgument, ort_state.NotImplemented, ort_state.RuntimeException)
LENGTHS_FIX = (
    "if the model takes only some lengths (a UNet-like model: multiples of 2**halvings), list them under "
    "lengths: and make max_shape one of them (`exporters init` finds them for an ONNX file)"
)


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
