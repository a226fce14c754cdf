"""Open an ONNX file as the python-based ``onnxruntime`` backend serves it, shared with the build's
check so a file the build ran is a file the backend loads. Only onnxruntime: it is copied flat."""

from __future__ import annotations

from typing import Any

import onnxruntime as ort


def open_session(
    model: str | bytes, intra_op: int, inter_op: int, providers: list[Any], quiet: bool = False
) -> ort.InferenceSession:
    """A session for ``model`` (a path or bytes); 0 threads: onnxruntime decides. ``quiet`` where the
    caller explains a refused run itself (onnxruntime would log it raw first)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op
    options.inter_op_num_threads = inter_op
    options.log_severity_level = 4 if quiet else options.log_severity_level
    return ort.InferenceSession(model, options, providers=providers)
