"""Input guards: what the spec promises about values, turned into limits the serving side enforces.

Triton checks dtypes and shapes, never values. Two value rules matter here: float inputs must be
finite (a NaN or ±Inf input gives a NaN answer, and ``NaN`` in a JSON response is not JSON), and
integer inputs declared with ``range: [lo, hi)`` must fall inside it (onnxruntime's ``Gather``
accepts ids in ``[-rows, rows)``, so a negative id silently wraps to the end of its table).

The rules travel to the server as standard ``parameters`` entries of ``config.pbtxt`` (string key →
string value), so the config stays valid for the native onnxruntime backend, which reads only the
keys it knows and ignores these: there the guard does not run (see docs/SERVING.md, "Bad input and overload").
Our python-based ``onnxruntime`` backend and the torch stage runner read them in ``initialize``
(``python_backend.batching.with_value_guards``) and check every request before it is batched.

Also here: the spec's upper bounds on ``max_batch_size`` and on the shared memory a full batch
implies, and the zoo option check, so a bad number is a ``SpecError`` naming the field, not a warm-up
at batch 10^8 or a traceback from inside a torch constructor.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from exporters.errors import SpecError
from python_backend.dtypes import DTYPES

# Keys of config.pbtxt ``parameters`` our backend reads (the native backend ignores unknown keys).
RANGES_PARAMETER = "input_ranges"  # JSON: {"sparse_ids": [0, 1000]}, half-open
ALLOW_NON_FINITE_PARAMETER = "allow_non_finite_inputs"  # "true" | "false"
MAX_SHAPES_PARAMETER = "input_max_shapes"  # JSON: {"tokens": [200]}, each input's max_shape (no batch)

MAX_BATCH_SIZE = 4096
MAX_BATCH_BYTES = 1 << 30  # inputs + outputs of one full batch; the Python backend's shm is 4× this


def check_batch_bounds(max_batch_size: int, tensors: Iterable[tuple[str, tuple[int, ...]]]) -> None:
    """``SpecError`` unless ``max_batch_size`` and the bytes of one full batch stay within bounds.

    ``tensors`` are ``(dtype, largest shape)`` of every input and output. Paths are relative to the
    model (``max_batch_size``); the spec parser prefixes ``models[i].``. Without the bound, a typo like
    ``max_batch_size: 100000000`` is accepted and each Python-backend stub maps tens of GiB of
    shared memory sized for it (the launcher sizes shm as 4 × the largest batch).
    """
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


def check_zoo_options(options: Mapping[str, Any]) -> None:
    """Every zoo option is a size: a positive integer or a non-empty list of them."""
    for key, value in options.items():
        values = value if isinstance(value, list) else [value]
        if not values or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values):
            raise SpecError(f"options.{key}", f"must be a positive integer or a list of them, got {value!r}")


def guard_parameters(
    ranges: Mapping[str, tuple[int, int]],
    allow_non_finite: bool,
    max_shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> dict[str, str]:
    """The ``parameters`` entries that carry the guards to the python-based backend. ``max_shapes``
    (inputs with a variable axis: their ``max_shape``) bounds what the config's ``-1`` dims admit:
    Triton checks only fixed dims, and a request past the bound the spec promised would run."""
    parameters = {ALLOW_NON_FINITE_PARAMETER: "true" if allow_non_finite else "false"}
    if ranges:
        parameters[RANGES_PARAMETER] = json.dumps({name: list(bounds) for name, bounds in ranges.items()})
    if max_shapes:
        parameters[MAX_SHAPES_PARAMETER] = json.dumps({name: list(dims) for name, dims in max_shapes.items()})
    return parameters
