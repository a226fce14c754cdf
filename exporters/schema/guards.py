"""Input guards: what the spec promises about values, as ``config.pbtxt`` ``parameters`` our backend enforces
(Triton checks dtypes and shapes, never values: docs/SERVING.md, "Bad input and overload"); and the
bounds on ``max_batch_size`` and a full batch's bytes, so a typo is a ``SpecError``, not GiB of shm."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping

from exporters.errors import SpecError
from python_backend.dtypes import DTYPES

RANGES_PARAMETER = "input_ranges"  # JSON: {"sparse_ids": [0, 1000]}, half-open
ALLOW_NON_FINITE_PARAMETER = "allow_non_finite_inputs"  # "true" | "false"
MAX_SHAPES_PARAMETER = "input_max_shapes"  # JSON: {"tokens": [200]}, each input's max_shape (no batch)

MAX_BATCH_SIZE = 4096
MAX_BATCH_BYTES = 1 << 30  # inputs + outputs of one full batch; the Python backend's shm is 4× this


def check_batch_bounds(max_batch_size: int, tensors: Iterable[tuple[str, tuple[int, ...]]]) -> None:
    """``SpecError`` unless ``max_batch_size`` and the bytes of one full batch (``tensors``: ``(dtype,
    largest shape)`` of every input and output) stay within bounds: stubs size their shm by them."""
    if max_batch_size > MAX_BATCH_SIZE:
        raise SpecError("max_batch_size", f"must be <= {MAX_BATCH_SIZE}, got {max_batch_size}")
    per_sample = sum(
        math.prod(max(dim, 1) for dim in shape) * (DTYPES[dtype].size if dtype in DTYPES else 8)
        for dtype, shape in tensors
    )
    total = per_sample * max_batch_size
    if total > MAX_BATCH_BYTES:
        raise SpecError(
            "max_batch_size",
            f"a full batch of {max_batch_size} needs {total / (1 << 20):.0f} MiB of inputs and outputs "
            f"(limit {MAX_BATCH_BYTES >> 20} MiB, and the Python backend maps 4x that per stub); "
            "lower max_batch_size",
        )


def guard_parameters(
    ranges: Mapping[str, tuple[int, int]],
    allow_non_finite: bool,
    max_shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> dict[str, str]:
    """The ``parameters`` entries that carry the guards. ``max_shapes`` bounds the config's ``-1`` dims:
    Triton checks only fixed dims, so a request past the bound the spec promised would run."""
    parameters = {ALLOW_NON_FINITE_PARAMETER: "true" if allow_non_finite else "false"}
    if ranges:
        parameters[RANGES_PARAMETER] = json.dumps({name: list(bounds) for name, bounds in ranges.items()})
    if max_shapes:
        parameters[MAX_SHAPES_PARAMETER] = json.dumps({name: list(dims) for name, dims in max_shapes.items()})
    return parameters
