"""The checks both fronts make on every inference input before Triton sees it, whatever the protocol.

Triton 2.51 computes an input's byte size as ``elements × element size`` in 64-bit integers: a shape
like ``[1, 2**61]`` of INT64 wraps to 0, passes its byte-size check with empty contents, and the
Python-backend stub then aborts building a numpy array of 2**61 elements; a shape
like ``[64, 2**40]`` in a 300-byte HTTP body crashed the HTTP frontend while it allocated. Here the
product is taken in Python's unbounded integers and compared with the bytes that actually carry the
input (the body, the binary part, or the named shared-memory range), so an input can never declare
more data than it brings. Model names are checked too: Triton's C API reads them up to the first NUL,
so ``recommender\\x00x`` would reach ``recommender``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from python_backend.batching import beyond_max_shape, parse_max_shapes
from server.fronts.refusal import RequestRefusedError

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


# No dimension above 2^31 - 1 (fault matrix row 37): a real tensor that long on one axis needs 2 GiB or
# more, beyond the fronts' 64 MiB bodies and messages; only an input with another dimension of 0 can
# declare one, and Triton left such requests (``[2^62, 0]``) unanswered, each holding a connection.
MAX_ANY_DIM = (1 << 31) - 1


@dataclass(frozen=True)
class ModelShapes:
    """What one model's config lets its inputs declare: ``max_batch_size`` (0: no batch dimension) and
    each input's ``dims`` (-1: any length), read from the config Triton serves."""

    model: str
    max_batch_size: int
    dims: dict[str, tuple[int, ...]]
    max_dims: dict[str, tuple[int, ...]] = field(default_factory=dict)  # the -1 dims' bounds, if written

    @classmethod
    def from_config(cls, model: str, config: Mapping[str, Any]) -> ModelShapes:
        """From a config as JSON (Triton's ``/v2/models/<m>/config``, or the gRPC ``ModelConfig`` as a
        dict: int64 fields may come as strings). ``max_dims``: the ``input_max_shapes`` parameter our
        builds write; one that does not parse is left to the backend, which refuses to load with it."""
        inputs = config.get("input") or []
        dims = {str(item["name"]): tuple(int(d) for d in item.get("dims") or ()) for item in inputs}
        try:
            max_dims = parse_max_shapes(dict(config.get("parameters") or {}))
        except ValueError:
            max_dims = {}
        return cls(model, int(config.get("max_batch_size") or 0), dims, max_dims)


def _listed(dims: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def check_fits_model(name: object, shape: Sequence[int], per_element: int, model: ModelShapes | None) -> None:
    """``RequestRefusedError`` unless ``shape`` is one the model can run (fault matrix row 37): no
    dimension above ``MAX_ANY_DIM``, a byte size that fits int64 whatever the zeros, and, where the
    model's config is known, its rank, fixed dims and ``max_batch_size``. The messages for the last
    two are Triton's own, so a client reads the same answer with the fronts or without."""
    if any(d > MAX_ANY_DIM for d in shape):
        raise RequestRefusedError(
            f"input {name!r} declares shape {list(shape)}: a dimension above {MAX_ANY_DIM} fits no model"
        )
    if math.prod(d for d in shape if d) * per_element > MAX_DIM:
        raise RequestRefusedError(
            f"input {name!r} declares shape {list(shape)}, whose size overflows a 64-bit integer"
        )
    if model is None or not isinstance(name, str) or name not in model.dims:
        return  # an unknown model or input: Triton names it
    dims, batched = model.dims[name], model.max_batch_size > 0
    if len(shape) != len(dims) + batched or any(
        d != -1 and s != d for s, d in zip(shape[batched:], dims, strict=True)
    ):
        expected = [-1, *dims] if batched else list(dims)
        raise RequestRefusedError(
            f"unexpected shape for input '{name}' for model '{model.model}'. Expected {_listed(expected)}, "
            f"got {_listed(shape)}."
        )
    excess = (
        beyond_max_shape(name, list(shape), model.max_dims[name])
        if batched and name in model.max_dims
        else None
    )
    if excess:
        raise RequestRefusedError(excess)
    if batched and shape[0] > model.max_batch_size:
        raise RequestRefusedError(
            f"input {name!r} declares a batch of {shape[0]}: inference request batch-size must be <= "
            f"{model.max_batch_size} for '{model.model}'"
        )
