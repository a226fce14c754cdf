"""Open an ONNX file in onnxruntime as the python-based ``onnxruntime`` backend serves it.

Shared by the backend and the build's check (``exporters.onnx_export``), so a file the build has run
is a file the backend loads. Imports only onnxruntime: it is copied flat into the backend folder.
"""

from __future__ import annotations

from typing import Any

import onnxruntime as ort


def open_session(
    model: str | bytes, intra_op: int, inter_op: int, providers: list[Any]
) -> ort.InferenceSession:
    """A session for ``model`` (a path or bytes); 0 threads: onnxruntime decides."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op
    options.inter_op_num_threads = inter_op
    return ort.InferenceSession(model, options, providers=providers)
