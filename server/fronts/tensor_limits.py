"""Checks of every inference input that need no config: a shape never declares more than its bytes
carry (Triton wraps ``elements × size`` in 64 bits), a model name has no NUL, and each value is one
its datatype holds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from server.fronts.refusal import RequestRefusedError

# Bytes per element of each Triton datatype; BYTES elements carry at least their 4-byte length prefix.
ELEMENT_BYTES = {
    "BOOL": 1, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "FP16": 2, "BF16": 2,
    "UINT32": 4, "INT32": 4, "FP32": 4, "UINT64": 8, "INT64": 8, "FP64": 8, "BYTES": 4,
}  # fmt: skip
MAX_DIM = (1 << 63) - 1  # Triton reads dims as int64
# no dimension above 2^31 - 1 (fault matrix row 37): only a shape with a 0 can declare one within a
# body, and Triton left such requests (``[2^62, 0]``) unanswered
MAX_ANY_DIM = (1 << 31) - 1
LENGTH_PREFIX = 4  # a BYTES element in binary form: its length, 4 bytes little-endian, then its bytes
# Triton casts a JSON value or gRPC typed content to its datatype unbounded (300 as UINT8 runs as 44,
# 1e39 as FP32 as infinity): such values are refused (fault matrix row 68)
INTEGER_BITS = {f"{sign}INT{bits}": bits for sign in ("", "U") for bits in (8, 16, 32, 64)}
FP32_MAX = float.fromhex("0x1.fffffep+127")


def check_model_name(name: object) -> None:
    """A model name without control characters (Triton's C API stops reading it at a NUL)."""
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
    """The fewest bytes one element of ``datatype`` takes in binary form (unknown: 1)."""
    return ELEMENT_BYTES.get(datatype, 1) if isinstance(datatype, str) else 1


def check_declared_size(
    name: object, shape: Sequence[int], per_element: int, carried: int, what: str
) -> None:
    """``RequestRefusedError`` if ``shape`` needs more than the ``carried`` bytes of ``what``."""
    elements = math.prod(shape)
    if elements * per_element > carried:
        raise RequestRefusedError(
            f"input {name!r} declares shape {list(shape)} ({elements} elements) but {what} carries only "
            f"{carried} bytes for it"
        )


def check_dims_fit_int64(name: object, shape: Sequence[int], per_element: int) -> None:
    """``RequestRefusedError`` for a shape no model can run (fault matrix row 37)."""
    if any(d > MAX_ANY_DIM for d in shape):
        raise RequestRefusedError(
            f"input {name!r} declares shape {list(shape)}: a dimension above {MAX_ANY_DIM} fits no model"
        )
    if math.prod(d for d in shape if d) * per_element > MAX_DIM:
        raise RequestRefusedError(
            f"input {name!r} declares shape {list(shape)}, whose size overflows a 64-bit integer"
        )


def count_bytes_elements(payload: bytes | memoryview, expected: int) -> tuple[int, int]:
    """``(elements, bytes walked)`` of BYTES length prefixes, up to ``expected + 1``."""
    view = memoryview(payload)
    elements = offset = 0
    while offset + LENGTH_PREFIX <= len(view) and elements <= expected:
        length = int.from_bytes(view[offset : offset + LENGTH_PREFIX], "little")
        if offset + LENGTH_PREFIX + length > len(view):
            break
        offset += LENGTH_PREFIX + length
        elements += 1
    return elements, offset


def integers_of(datatype: object) -> tuple[int, int, str] | None:
    """The integers ``datatype`` holds, ``[low, high)``, and how a refusal names them; None: not one."""
    bits = INTEGER_BITS.get(datatype) if isinstance(datatype, str) else None
    if bits is None:
        return None
    if datatype.startswith("U"):
        return 0, 1 << bits, f"integers in [0, 2^{bits})"
    half = 1 << (bits - 1)
    return -half, half, f"integers in [-2^{bits - 1}, 2^{bits - 1})"


def value_fits(datatype: object) -> Callable[[float], bool] | None:
    """A test that a number is one ``datatype`` holds (None: no bound)."""
    integers = integers_of(datatype)
    if integers is not None:
        low, high, _ = integers
        return lambda value: low <= value < high
    if datatype == "FP32":
        return lambda value: not FP32_MAX < abs(value) < math.inf
    return None


def check_value_fits(name: object, datatype: object, value: float) -> None:
    """``RequestRefusedError`` naming input ``name`` if ``datatype`` cannot hold ``value``."""
    fits = value_fits(datatype)
    if fits is None or fits(value):
        return
    integers = integers_of(datatype)
    if integers is not None:
        raise RequestRefusedError(
            f"input {name!r}: {datatype} data must be {integers[2]}, got {str(value)[:40]}"
        )
    raise RequestRefusedError(
        f"input {name!r}: {value!r} is beyond {datatype} (±3.4e38); Triton would run it as infinity"
    )
