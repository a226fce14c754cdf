"""The ways of sending a variable-length model's traffic, measured side by side, as perf's shapes study
and the shapes sections of tune and plan share them: every request at one length, each at its own,
and padded to each bucket set ``perf.measure.padding_check`` finds harmless (priced as raw compute).
The caller serves and measures with our client, whose records carry each request's length.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from exporters.schema.models import ModelSpec
from perf.markdown import ratio
from perf.measure import shapes
from perf.measure.measurement import Measurement
from perf.measure.padding_check import PaddingVerdict, offered_ways
from perf.measure.target import Target

ONE_LENGTH = "one length"  # the run that sends every request at one length
Send = Callable[[tuple[int, ...] | None], Target]  # the target of the runs that follow (None: one length)
Measure = Callable[[Target, str, int], Measurement]  # one run: its way's name, the one length (else 0)


@dataclass(frozen=True)
class BucketRun:
    """One way of sending, measured: ``buckets`` None for every request at ``length``, ``()`` for each
    at its own, else the bucket set."""

    name: str
    buckets: tuple[int, ...] | None
    measured: Measurement
    padding: shapes.PaddingCost | None = None
    length: int = 0

    def rows(self, max_batch: int) -> list[shapes.ShapeRow]:
        """The formed batches per length sent (the one-length target's records carry no length)."""
        records = self.measured.measured_records()
        if self.buckets is None:
            records = [dataclasses.replace(r, length=self.length, sent_length=self.length) for r in records]
        return shapes.shape_rows(records, max_batch, self.measured.stats.executions)

    def formed_lines(self, max_batch: int) -> list[str]:
        """The run's per-length table under its heading."""
        table = shapes.shape_table(self.rows(max_batch))
        return [f"### {self.name}: formed batches per length sent", "", *table]

    def padding_cells(self) -> list[str]:
        """The tables' padding columns: compute ×, padded share ("–" for a run that pads nothing)."""
        if self.padding is None:
            return ["–", "–"]
        return [ratio(self.padding.ratio), f"{self.padding.padded_share:.0%}"]


@dataclass(frozen=True)
class Ways:
    """A model's ways of sending: ``offered`` (measured) and ``refused`` (padding changes the answer)."""

    model: ModelSpec
    onnx_file: Path
    seed: int
    mix: shapes.ShapeMix
    offered: dict[str, tuple[int, ...]]
    refused: dict[str, PaddingVerdict]

    def measure(self, send: Send, measure: Measure) -> list[BucketRun]:
        """One run at a single length, then one per offered way, in order."""
        target = send(None)
        length = shapes.length_of(self.model, list(target.inputs.values()))
        runs = [BucketRun(ONE_LENGTH, None, measure(target, ONE_LENGTH, length), length=length)]
        return runs + [BucketRun(name, b, measure(send(b), name, 0)) for name, b in self.offered.items()]

    def priced(self, runs: list[BucketRun]) -> list[BucketRun]:
        """``runs`` with each bucketed run's padding cost, timed in-process on the served file."""
        timer = shapes.onnx_timer(self.onnx_file, self.model, shapes.PADDING_BATCH, self.seed)
        bound = self.model.variable_bound
        return [dataclasses.replace(run, padding=shapes.padding_cost(self.mix, run.buckets, bound, timer))
                if run.buckets else run for run in runs]  # fmt: skip


def ways_of(model: ModelSpec, onnx_file: Path, seed: int) -> Ways:
    """The ``bucket_ways`` of ``model``'s traffic, each checked on ``onnx_file`` first."""
    mix = shapes.shape_mix(model, seed)
    offered, refused = offered_ways(shapes.bucket_ways(model, seed), onnx_file, model, mix, seed)
    return Ways(model, onnx_file, seed, mix, offered, refused)


def choose(runs: list[BucketRun], budget_ms: float | None = None) -> BucketRun:
    """The run that meets ``budget_ms`` with the lowest p99, else the one that served the most; never
    the one-length run (it is not the traffic)."""
    shaped = [run for run in runs if run.buckets is not None]
    meeting = [run for run in shaped if budget_ms is not None and run.measured.meets(budget_ms)]
    if meeting:
        return min(meeting, key=lambda run: run.measured.p99_ms)
    return max(shaped, key=lambda run: run.measured.throughput)
