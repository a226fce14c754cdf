"""The checks both fronts make on every inference input before Triton sees it, whatever the protocol.

Triton 2.51 computes an input's byte size as ``elements × element size`` in 64-bit integers: a shape
like ``[1, 2**61]`` of INT64 wraps to 0, passes its byte-size check with empty contents, and the
Python-backend stub then aborts building a numpy array of 2**61 elements (issue 28, item 3); a shape
like ``[64, 2**40]`` in a 300-byte HTTP body crashed the HTTP frontend while it allocated. Here the
product is taken in Python's unbounded integers and compared with the bytes that actually carry the
input (the body, the binary part, or the named shared-memory range), so an input can never declare
more data than it brings. Model names are checked too: Triton's C API reads them up to the first NUL,
so ``recommender\\x00x`` would reach ``recommender``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from server.refusal import RequestRefusedError

# Bytes per element of each Triton datatype; BYTES elements carry at least their 4-byte length prefix.
ELEMENT_BYTES = {
    "BOOL": 1, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "FP16": 2, "BF16": 2,
    "UINT32": 4, "INT32": 4, "FP32": 4, "UINT64": 8, "INT64": 8, "FP64": 8, "BYTES": 4,
}  # fmt: skip
MAX_DIM = (1 << 63) - 1  # Triton reads dims as int64


def check_model_name(name: object) -> None:
    """A model name Triton reads the way we do: a string without control characters (Triton's C API
    stops reading it at a NUL). An empty name is Triton's to judge (statistics: every model)."""
    if not isinstance(name, str) or any(ord(c) < 0x20 or c == "\x7f" for c in name):
        raise RequestRefusedError(
            f"model name {name!r} holds a control character (Triton would read only what precedes it)"
        )


def check_shape(name: object, shape: object) -> list[int]:
    """``shape`` as a list of non-negative int64 dims, or ``RequestRefusedError`` naming the input."""
    dims = list(shape) if isinstance(shape, list | tuple) else None
    if dims is None or not all(
        isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= MAX_DIM for d in dims
    ):
        raise RequestRefusedError(
            f"input {name!r}: shape must be a list of non-negative integers, got {shape!r}"
        )
    return dims


def element_bytes(datatype: object) -> int:
    """The fewest bytes one element of ``datatype`` takes in binary form (an unknown datatype counts
    one byte; Triton then names it)."""
    return ELEMENT_BYTES.get(datatype, 1) if isinstance(datatype, str) else 1


def check_declared_size(
    name: object, shape: Sequence[int], per_element: int, carried: int, what: str
) -> None:
    """``RequestRefusedError`` if the input's ``shape``, at ``per_element`` bytes or more per element, needs
    more than the ``carried`` bytes of ``what`` (e.g. "the request", "its binary data", "its shared
    memory range"). The product is exact here, never wrapped."""
    elements = math.prod(shape)
    if elements * per_element > carried:
        raise RequestRefusedError(
            f"input {name!r} declares shape {list(shape)} ({elements} elements) but {what} carries only "
            f"{carried} bytes for it"
        )
