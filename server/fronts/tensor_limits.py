"""The checks both fronts make on every inference input before Triton sees it, whatever the protocol and
whatever the model: the bounds that need no config (``server.fronts.allow_list`` holds the model's).

Triton 2.51 computes an input's byte size as ``elements × element size`` in 64-bit integers: a shape
like ``[1, 2**61]`` of INT64 wraps to 0, passes its byte-size check with empty contents, and the
Python-backend stub then aborts building a numpy array of 2**61 elements; a shape
like ``[64, 2**40]`` in a 300-byte HTTP body crashed the HTTP frontend while it allocated. Here the
product is taken in Python's unbounded integers and compared with the bytes that actually carry the
input (the body, the binary part, or the named shared-memory range), so an input can never declare
more data than it brings. Model names are checked too: Triton's C API reads them up to the first NUL,
so ``recommender\\x00x`` would reach ``recommender``. And each value must be one its datatype holds:
Triton casts what the client wrote to the datatype unchecked (``check_value_fits``).
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
# No dimension above 2^31 - 1 (fault matrix row 37): a real tensor that long on one axis needs 2 GiB or
# more, beyond the fronts' 64 MiB bodies and messages; only an input with another dimension of 0 can
# declare one, and Triton left such requests (``[2^62, 0]``) unanswered, each holding a connection.
MAX_ANY_DIM = (1 << 31) - 1
LENGTH_PREFIX = 4  # a BYTES element in binary form: its length, 4 bytes little-endian, then its bytes
# Triton casts each value of an input to its datatype without a bound, whatever carries it: a JSON value
# ("FIXME for unsigned should bounds check" in its HTTP server) and a gRPC typed content, whose field is
# wider than the narrow datatypes (int_contents is int32 for INT8 and INT16, uint_contents uint32 for
# UINT8 and UINT16). 300 as UINT8 runs as 44, 2^32 + 5 as INT32 as 5, 1e39 as FP32 as infinity. Both
# fronts read the value the client wrote, so a value its datatype cannot hold is refused (one reading;
# fault matrix row 68).
INTEGER_BITS = {f"{sign}INT{bits}": bits for sign in ("", "U") for bits in (8, 16, 32, 64)}
FP32_MAX = float.fromhex("0x1.fffffep+127")


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
    one byte; the allow-list then names it)."""
    return ELEMENT_BYTES.get(datatype, 1) if isinstance(datatype, str) else 1


def check_declared_size(
    name: object, shape: Sequence[int], per_element: int, carried: int, what: str
) -> None:
    """``RequestRefusedError`` if the input's ``shape``, at ``per_element`` bytes or more per element, needs
    more than the ``carried`` bytes of ``what`` (e.g. "the request", "its binary data", "its shared
    memory range"). The product is exact here, never wrapped. A first bound, checked before anything
    is counted; the allow-list then asks for exactly what the shape needs."""
    elements = math.prod(shape)
    if elements * per_element > carried:
        raise RequestRefusedError(
            f"input {name!r} declares shape {list(shape)} ({elements} elements) but {what} carries only "
            f"{carried} bytes for it"
        )


def check_dims_fit_int64(name: object, shape: Sequence[int], per_element: int) -> None:
    """``RequestRefusedError`` for a shape no model can run, whatever its config says (fault matrix
    row 37): a dimension above ``MAX_ANY_DIM``, or a byte size beyond int64 whatever the zeros."""
    if any(d > MAX_ANY_DIM for d in shape):
        raise RequestRefusedError(
            f"input {name!r} declares shape {list(shape)}: a dimension above {MAX_ANY_DIM} fits no model"
        )
    if math.prod(d for d in shape if d) * per_element > MAX_DIM:
        raise RequestRefusedError(
            f"input {name!r} declares shape {list(shape)}, whose size overflows a 64-bit integer"
        )


def count_bytes_elements(payload: bytes | memoryview, expected: int) -> tuple[int, int]:
    """Walk the length prefixes of BYTES elements in binary form: ``(elements, bytes walked)``. The walk
    stops at a prefix that runs past the end, so ``bytes walked < len(payload)`` says the buffer is not
    whole elements (a short prefix, a length beyond the end), and after ``expected + 1`` elements (one
    more than the shape needs already says it is wrong)."""
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
    """The integers ``datatype`` holds, ``[low, high)``, and how a refusal names them (``integers in
    [0, 2^8)``); None for a datatype that is not an integer type."""
    bits = INTEGER_BITS.get(datatype) if isinstance(datatype, str) else None
    if bits is None:
        return None
    if datatype.startswith("U"):
        return 0, 1 << bits, f"integers in [0, 2^{bits})"
    half = 1 << (bits - 1)
    return -half, half, f"integers in [-2^{bits - 1}, 2^{bits - 1})"


def value_fits(datatype: object) -> Callable[[float], bool] | None:
    """A test that a number, as the client wrote it (a JSON value, a gRPC typed content), is one
    ``datatype`` holds (see ``INTEGER_BITS``); None for a datatype that has no such bound. NaN and
    ±infinity are FP32 values, the model's to refuse."""
    integers = integers_of(datatype)
    if integers is not None:
        low, high, _ = integers
        return lambda value: low <= value < high
    if datatype == "FP32":
        return lambda value: not FP32_MAX < abs(value) < math.inf
    return None


def check_value_fits(name: object, datatype: object, value: float) -> None:
    """``RequestRefusedError`` naming input ``name`` if ``value`` is one ``datatype`` cannot hold
    (``value_fits``): Triton would run another."""
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
