"""Open an ONNX file in onnxruntime the way the python-based ``onnxruntime`` backend serves it.

Shared by the backend (``model.py``, installed beside this file) and the build's check
(``exporters.onnx_export``), so a file the build has run is a file the backend loads: the same session
options (thread counts) and the same reading of the file's symbolic axes (``batching.shared_axes``).
Imports only onnxruntime: it is copied flat into the backend folder, and imported from the package.
"""

from __future__ import annotations

from typing import Any

import onnxruntime as ort


def open_session(
    model: str | bytes, intra_op: int, inter_op: int, providers: list[Any]
) -> ort.InferenceSession:
    """A session for ``model`` (a path or the file's bytes) with ``intra_op`` / ``inter_op`` threads
    (0: onnxruntime decides), on ``providers``."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op
    options.inter_op_num_threads = inter_op
    return ort.InferenceSession(model, options, providers=providers)
