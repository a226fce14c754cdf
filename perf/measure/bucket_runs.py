"""The ways of sending a variable-length model's traffic, measured side by side (perf's shapes study,
tune's and plan's shapes sections): one length, each its own, and each bucket set whose padding leaves
every output within the spec's tolerance (docs/PERF.md, "Shapes as served")."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from exporters.artifacts.parity import check_outputs
from exporters.schema.models import ModelSpec
from exporters.sources.inputs import draw_inputs
from perf.markdown import ratio
from perf.measure import shapes
from perf.measure.measurement import Measurement
from perf.measure.shapes import ShapeMix, bucket_of, length_of, resized
from perf.measure.target import Target

ROWS = 2  # rows per run: enough to see a difference, cheap at the longest bucket
QUANTILES = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9)  # the traffic's lengths that are padded and compared
ONE_LENGTH = "one length"  # the run that sends every request at one length
Send = Callable[[tuple[int, ...] | None], Target]  # the target of the runs that follow (None: one length)
Measure = Callable[[Target, str, int], Measurement]  # one run: its way's name, the one length (else 0)


@dataclass(frozen=True)
class PaddingVerdict:
    """Whether padding to ``buckets`` keeps every output within tolerance; ``detail`` says what moved."""

    buckets: tuple[int, ...]
    harmless: bool
    detail: str


def padding_probe(onnx_path: Path, spec: ModelSpec, seed: int = 0) -> Callable[[int, int], tuple[bool, str]]:
    """``compare(length, padded_to)`` on the served ONNX file in-process (one thread): (within tolerance,
    what the worst output did), padded outputs cropped to the true shape."""
    from python_backend.onnxruntime.ort_session import open_session  # only where buckets are judged

    session = open_session(str(onnx_path), 1, 1, ["CPUExecutionProvider"])
    base, names = longest_draw(spec, seed), [t.name for t in spec.outputs]

    def compare(length: int, padded_to: int) -> tuple[bool, str]:
        true = resized(spec, base, length)
        expected, actual = session.run(names, true), session.run(names, resized(spec, true, padded_to))
        checks = [
            check_outputs(want, got[tuple(slice(0, size) for size in want.shape)], tensor.tolerance,
                          spec.precision, tensor.name)
            for tensor, want, got in zip(spec.outputs, expected, actual, strict=True)
        ]  # fmt: skip
        worst = max(checks, key=lambda c: (not c.ok, c.max_rel_error))
        words = (
            f"length {length} padded to {padded_to}: {worst.name} moved by up to {worst.max_abs_error:.3g} "
            f"on values up to {worst.scale:.3g} (max rel {worst.max_rel_error:.3g}, the spec's tolerance "
            f"{worst.tolerance.max_rel:g})"
        )
        return all(c.ok for c in checks), words

    return compare


def longest_draw(spec: ModelSpec, seed: int, draws: int = 16) -> dict[str, np.ndarray]:
    """``ROWS`` rows drawn at the axis bound, or the longest of ``draws`` calls of the spec's sampler:
    shorter lengths are cropped from it."""
    if spec.sample is None:
        spec = dataclasses.replace(spec, lengths=(spec.variable_bound,))
    names = [t.name for t in spec.inputs]
    count = draws if spec.sample is not None else 1
    candidates = [dict(zip(names, draw_inputs(spec, ROWS, seed + k), strict=True)) for k in range(count)]
    return max(candidates, key=lambda arrays: length_of(spec, list(arrays.values())))


def offered_ways(
    ways: dict[str, tuple[int, ...]], onnx_path: Path, spec: ModelSpec, mix: ShapeMix, seed: int = 0
) -> tuple[dict[str, tuple[int, ...]], dict[str, PaddingVerdict]]:
    """``ways`` split into those padding leaves harmless (offered) and the others, with their verdicts: the
    mix's quantile lengths are padded as each set pads, and the first that moves beyond tolerance decides."""
    compare = padding_probe(onnx_path, spec, seed)
    lengths = sorted({mix.quantile(q) if q else mix.lengths[0] for q in QUANTILES})

    offered, refused = {}, {}
    for name, buckets in ways.items():
        padded = {n: bucket_of(n, buckets, spec.variable_bound) for n in lengths} if buckets else {}
        checks = (compare(n, to) for n, to in padded.items() if to != n)  # lazily: the first harm decides
        words = next((words for harmless, words in checks if not harmless), None)
        if words is None:
            offered[name] = buckets
        else:
            refused[name] = PaddingVerdict(tuple(buckets), False, f"padding changes the answer: {words}")
    return offered, refused


def refused_lines(refused: dict[str, PaddingVerdict]) -> list[str]:
    """The report's sentence for bucket sets not offered ([] where none was refused)."""
    if not refused:
        return []
    parts = [f"{name} {list(v.buckets)}: {v.detail}" for name, v in refused.items()]
    return [
        f"Not offered, not measured (padding checked on the served ONNX file, {ROWS} rows at the traffic's "
        "lengths, padded as each set pads, outputs held to the spec's tolerance): " + "; ".join(parts) + "."
    ]


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
