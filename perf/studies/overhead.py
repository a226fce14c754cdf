"""What serving adds to one execution: the server's compute per execution minus raw onnxruntime's
for the same batch, in ms (a ratio hides the size of the cost); raw is interpolated, never extrapolated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from client.stats import BatchBucket
from perf.markdown import number, ratio, table
from perf.measure.raw import RawPoint

NOT_MEASURED = "could not be measured"


@dataclass(frozen=True)
class Overhead:
    batch: float  # mean batch size of the executions it holds for
    executions: int
    served_ms: float  # the server's compute per execution
    raw_ms: float  # raw onnxruntime per execution at the same batch sizes; NaN where unknown
    raw_missing: str = ""  # why ``raw_ms`` is unknown

    @property
    def ms(self) -> float:
        return self.served_ms - self.raw_ms

    @property
    def ratio(self) -> float:
        return self.served_ms / self.raw_ms if self.raw_ms > 0 else math.nan

    def missing(self) -> str | None:
        if self.executions <= 0:
            return "the server ran no execution in the measured windows"
        if self.raw_missing:
            return self.raw_missing
        if not math.isfinite(self.served_ms):
            return "the served compute per execution is not a number"
        if not math.isfinite(self.raw_ms):
            return "raw onnxruntime's time is not a number"
        if self.ms < 0:
            return (
                f"served compute {number(self.served_ms, 3)} ms is below raw onnxruntime's "
                f"{number(self.raw_ms, 3)} ms: the two were timed at different moments on shared cores"
            )
        return None


def raw_ms_at(raw: Sequence[RawPoint], size: int) -> float | None:
    """Raw onnxruntime ms at ``size`` rows, linear between measured sizes; None outside them."""
    points = sorted(raw, key=lambda p: p.batch)
    if not points or not points[0].batch <= size <= points[-1].batch:
        return None
    return float(np.interp(size, [p.batch for p in points], [p.batch_ms for p in points]))


def overhead_of(batches: Mapping[int, BatchBucket], raw: Sequence[RawPoint]) -> Overhead:
    executions = sum(b.executions for b in batches.values())
    if executions <= 0:
        return Overhead(math.nan, 0, math.nan, math.nan)
    batch = sum(size * b.executions for size, b in batches.items()) / executions
    served_ms = sum(b.compute_ns for b in batches.values()) / 1e6 / executions
    if not raw:
        return Overhead(batch, executions, served_ms, math.nan, "raw onnxruntime was not timed")
    raw_total = 0.0
    for size, bucket in batches.items():
        at = raw_ms_at(raw, size)
        if at is None:
            sizes = sorted(p.batch for p in raw)
            reason = f"batch {size} is outside the raw batch sizes ({sizes[0]}–{sizes[-1]})"
            return Overhead(batch, executions, served_ms, math.nan, reason)
        raw_total += at * bucket.executions
    return Overhead(batch, executions, served_ms, raw_total / executions)


def overhead_cell(overhead: Overhead | None) -> str:
    if overhead is None:
        return f"{NOT_MEASURED} (no server statistics)"
    why = overhead.missing()
    return f"{NOT_MEASURED} ({why})" if why else number(overhead.ms, 3)


def at_raw_sizes(
    batches: Mapping[int, BatchBucket], raw: Sequence[RawPoint], min_executions: int
) -> list[Overhead]:
    """One overhead per raw batch size the server formed at least ``min_executions`` times."""
    return [
        overhead_of({point.batch: batches[point.batch]}, raw)
        for point in sorted(raw, key=lambda p: p.batch)
        if point.batch in batches and batches[point.batch].executions >= min_executions
    ]


def by_batch_table(overheads: Sequence[Overhead]) -> str:
    rows = [
        [f"{o.batch:g}", o.executions, number(o.served_ms, 3), number(o.raw_ms, 3), overhead_cell(o),
         ratio(o.ratio) if o.missing() is None else "–"]
        for o in overheads
    ]  # fmt: skip
    return table(["batch", "executions", "served compute ms", "raw ms", "overhead ms", "served/raw"], rows)
