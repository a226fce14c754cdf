"""The shapes study: a model with a variable axis measured at the lengths its traffic takes.

For each model of the user's spec (``make perf SPEC=… MODELS=…``) whose inputs have a variable axis,
the study serves it with dynamic batching (1 ms) and measures the same closed loop (the goal
concurrency) several ways: every request at one length (one draw of the sampler: what perf, tune and
plan measured before they drew shapes as served), at the lengths the traffic takes (``perf.measure.shapes``:
the spec's ``shapes:`` or its sampler), and padded to buckets (the spec's ``buckets:`` and candidates
at quantiles of the lengths) where padding leaves the model's answer within the spec's tolerance
(``perf.measure.padding_check``; the others are named, with what padding did, and not measured). Triton's
dynamic batcher merges only equal shapes, so the single-length
rate is the optimistic one; buckets buy back batching at the price of computing the padding, which
the study measures as raw compute (the same ONNX file in-process) at the padded over the true lengths.
Per run it reports the formed batches per length sent (from the client's records: every request's
length is known; Triton's statistics give the executions per batch size over all lengths) and picks
the way of sending that served the most.
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

from exporters.repository import build_repository
from exporters.schema.models import ModelSpec, parse_spec
from exporters.schema.typed import to_data
from perf.markdown import number, ratio, table
from perf.measure.loads import closed_loop
from perf.measure.measurement import Measurement
from perf.measure.padding_check import PaddingVerdict, offered_ways, refused_lines
from perf.measure.shapes import (
    PADDING_BATCH,
    PaddingCost,
    ShapeRow,
    axis_bound,
    bucket_ways,
    has_variable_axis,
    length_of,
    onnx_timer,
    padding_cost,
    shape_mix,
    shape_rows,
    shape_table,
)
from perf.measure.target import Target, target_from_spec
from perf.model.grid import MAX_BATCH
from perf.studies.framework import StudyContext, StudyReport, write_report
from perf.studies.profiles import Profile
from perf.studies.study_spec import dynamic, family_entry

log = logging.getLogger(__name__)
DELAY_US = 1_000
SINGLE = "one length"


def shaped_families(profile: Profile) -> list[str]:
    """The profile's models whose inputs have a variable axis (the zoo's have none)."""
    return [name for name in profile.families if has_variable_axis(_model(profile, name))]


def _model(profile: Profile, family: str) -> ModelSpec:
    entry = family_entry(family, f"{family}_shapes", dynamic(DELAY_US), seed=profile.seed,
                         table=profile.family_table)  # fmt: skip
    return parse_spec({"models": [entry]}).models[0]


@dataclass(frozen=True)
class ShapeRun:
    """One way of sending the model's traffic, measured: the client's figures, Triton's formed batches
    over all lengths, the per-length rows, and (bucketed) the padding cost."""

    name: str
    lengths: str  # what was sent, in words
    buckets: tuple[int, ...]
    throughput: float
    p50_ms: float
    p99_ms: float
    failed: int
    mean_batch: float  # Triton's: requests per execution over the measured windows
    executions: dict[int, int]  # Triton's executions per batch size
    rows: tuple[ShapeRow, ...]
    padding: PaddingCost | None = None


def shape_run(
    name: str, lengths: str, target: Target, measured: Measurement, max_batch: int, one_length: int = 0
) -> ShapeRun:
    """``measured`` as a ``ShapeRun``; ``one_length``: the length of a target that sends one (its
    records carry none)."""
    summary, stats = measured.summary(), measured.stats
    records = measured.measured_records()
    if one_length:
        records = [dataclasses.replace(r, length=one_length, sent_length=one_length) for r in records]
    return ShapeRun(
        name, lengths, target.shapes.buckets if target.shapes else (), summary.throughput, summary.p50_ms,
        summary.p99_ms, summary.failed, stats.mean_batch,
        {size: b.executions for size, b in sorted(stats.batches.items())},
        tuple(shape_rows(records, max_batch, stats.executions)),
    )  # fmt: skip


class ShapeStudy:
    name = "shapes"
    title = "shapes as served: variable-length models at their traffic's lengths, and buckets"
    serves_spec = False

    def steps(self, profile: Profile) -> int:
        families = shaped_families(profile)
        return sum(3 + len(self._ways(_model(profile, f), profile)) for f in families)

    @staticmethod
    def _ways(model: ModelSpec, profile: Profile) -> dict[str, tuple[int, ...]]:
        """The bucket sets measured: the candidates at quantiles, and the spec's own buckets."""
        return bucket_ways(model, profile.seed)

    def run(self, context: StudyContext) -> StudyReport:
        profile = context.profile
        lines = ["# Shapes as served", ""]
        figures: dict[str, dict] = {}
        context.workdir.mkdir(parents=True, exist_ok=True)
        for family in shaped_families(profile):
            with tempfile.TemporaryDirectory(prefix="shapes-", dir=context.workdir) as scratch:
                runs, mix_text, pick, refused = self._family(context, _model(profile, family), Path(scratch))
            figures[family] = {"lengths": mix_text, "runs": runs, "pick": pick, "not_offered": refused}
            lines += family_lines(family, mix_text, runs, pick, profile, refused)
        return write_report(context, self, lines, [], figures)

    def _family(
        self, context: StudyContext, model: ModelSpec, scratch: Path
    ) -> tuple[list[ShapeRun], str, str, dict[str, PaddingVerdict]]:
        profile = context.profile
        repository = scratch / "repository"
        context.progress(f"building {model.name}")
        build_repository(parse_spec({"models": [to_data(model)]}), repository, num_gpus=0)
        mix = shape_mix(model, profile.seed)
        load = closed_loop(profile.goal_concurrency)
        runs: list[ShapeRun] = []
        onnx_file = repository / model.name / "1" / "model.onnx"
        ways, refused = offered_ways(self._ways(model, profile), onnx_file, model, mix, profile.seed)
        for name in refused:  # the steps counted them: say why they are not measured
            context.progress(f"{model.name}, {name}: not measured (padding changes the answer)")
        context.progress("starting tritonserver")
        with context.server(repository, f"{model.name}-server.log") as server:
            url = server.grpc_url if profile.protocol == "grpc" else server.http_url

            def target(**options: object) -> Target:
                return target_from_spec(model, url, profile.protocol, seed=profile.seed, rows=MAX_BATCH,
                                        **options)  # fmt: skip

            single = target(vary_shapes=False)
            length = length_of(model, list(single.inputs.values()))
            measured = context.measure(server, single, load, f"{model.name} at one length ({length})")
            runs.append(shape_run(SINGLE, f"every request at {length}", single, measured, MAX_BATCH, length))
            for name, buckets in ways.items():
                shaped = target(buckets=buckets)
                measured = context.measure(server, shaped, load, f"{model.name}, {name}")
                sent = f"buckets {list(buckets)}" if buckets else "each request at its own length"
                runs.append(shape_run(name, sent, shaped, measured, MAX_BATCH))
        context.progress("padding cost (raw compute)")
        timer = onnx_timer(onnx_file, model, PADDING_BATCH, profile.seed)
        bound = axis_bound(model)
        runs = [
            dataclasses.replace(run, padding=padding_cost(mix, run.buckets, bound, timer))
            if run.buckets
            else run
            for run in runs
        ]
        varied = [run for run in runs if run.name != SINGLE]
        pick = max(varied, key=lambda run: run.throughput).name
        return runs, mix.describe(), pick, refused


def family_lines(
    family: str, lengths: str, runs: list[ShapeRun], pick: str, profile: Profile,
    refused: dict[str, PaddingVerdict] | None = None,
) -> list[str]:  # fmt: skip
    """The markdown of one model: the runs side by side, the bucket sets not offered (padding changes the
    answer), then each run's per-length table."""
    single = next(run for run in runs if run.name == SINGLE)
    header = ["sent", "lengths", "inf/s", "× one length", "p50 ms", "p99 ms", "failed", "mean batch (Triton)",
              "padding: compute ×", "padded share"]  # fmt: skip
    rows = [
        [run.name + (" (pick)" if run.name == pick else ""), run.lengths, number(run.throughput, 0),
         ratio(run.throughput / single.throughput if single.throughput else float("nan")),
         number(run.p50_ms), number(run.p99_ms), run.failed, number(run.mean_batch, 2),
         ratio(run.padding.ratio) if run.padding else "–",
         f"{run.padding.padded_share:.0%}" if run.padding else "–"]
        for run in runs
    ]  # fmt: skip
    lines = [
        f"## {family}",
        "",
        f"Request lengths: {lengths}. Dynamic batching ({DELAY_US // 1000} ms), closed loop at concurrency "
        f"{profile.goal_concurrency} over {profile.protocol}; the same load every run. Triton merges only "
        "requests of equal shapes: the one-length run is what a single-length measurement promises.",
        "",
        table(header, rows),
        "",
        f"Pick: **{pick}** (the most served of the ways that send the traffic's lengths). Padding cost: raw "
        f"compute of the padded lengths over the true ones, one onnxruntime thread, batch {PADDING_BATCH}.",
        "",
        *(line + "\n" for line in refused_lines(refused or {})),
    ]
    for run in runs:
        executions = ", ".join(f"{size}: {count}" for size, count in run.executions.items()) or "none read"
        lines += [
            f"### {run.name}: formed batches per length sent",
            "",
            *shape_table(run.rows),
            "",
            f"Triton's executions per batch size (all lengths): {executions}. Formed batches per length: "
            "responses of one length that arrive together, scaled to sum to Triton's executions.",
            "",
        ]
    return lines
