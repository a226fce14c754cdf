"""One request checked as ``run_batched`` checks each: the layout, then the values (a test helper)."""

from __future__ import annotations

from collections.abc import Sequence

from python_backend.batching import Arrays, TensorInfo, check_layout, check_values


def validate(arrays: Arrays, inputs: Sequence[TensorInfo]) -> int:
    """One request's inputs checked against the config, layout and values; its batch size."""
    rows = check_layout(arrays, inputs)
    check_values(arrays, inputs)
    return rows
