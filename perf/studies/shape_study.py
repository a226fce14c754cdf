"""The shapes study: each model of ``--models`` with a variable axis, measured each way of sending of
``perf.measure.bucket_runs`` under the same closed loop (docs/PERF.md, "Shapes as served")."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from exporters.repository import build_repository
from exporters.schema.models import ModelSpec, Spec, parse_spec
from perf.markdown import number, ratio, table
from perf.measure.bucket_runs import BucketRun, Ways, choose, refused_lines, ways_of
from perf.measure.loads import closed_loop
from perf.measure.measurement import Measurement
from perf.measure.shapes import PADDING_BATCH, bucket_ways, has_variable_axis
from perf.measure.target import Target, target_from_spec
from perf.model.grid import MAX_BATCH
from perf.studies.framework import StudyContext, StudyReport, write_report
from perf.studies.profiles import Profile
from perf.studies.study_spec import dynamic, family_entry

DELAY_US = 1_000


def shaped_families(profile: Profile) -> list[str]:
    """The profile's models whose inputs have a variable axis (the zoo's have none)."""
    return [name for name in profile.families if has_variable_axis(_model(profile, name))]


def _model(profile: Profile, family: str) -> ModelSpec:
    entry = family_entry(family, f"{family}_shapes", dynamic(DELAY_US), seed=profile.seed,
                         table=profile.family_table)  # fmt: skip
    return parse_spec({"models": [entry]}).models[0]


def sent(run: BucketRun) -> str:
    """What a run sent, in words."""
    if run.buckets is None:
        return f"every request at {run.length}"
    return f"buckets {list(run.buckets)}" if run.buckets else "each request at its own length"


def run_figures(run: BucketRun) -> dict[str, Any]:
    """A run's figures for ``shapes.json``."""
    summary, stats = run.measured.figures, run.measured.stats
    return {
        "name": run.name, "lengths": sent(run), "buckets": list(run.buckets or ()),
        "throughput": summary.throughput, "p50_ms": summary.p50_ms, "p99_ms": summary.p99_ms,
        "failed": summary.failed, "mean_batch": stats.mean_batch,
        "executions": {size: b.executions for size, b in sorted(stats.batches.items())},
        "rows": run.rows(MAX_BATCH), "padding": run.padding,
    }  # fmt: skip


class ShapeStudy:
    name = "shapes"
    title = "shapes as served: variable-length models at their traffic's lengths, and buckets"
    serves_spec = False

    def steps(self, profile: Profile) -> int:
        # building, starting the server, the one-length run, one run or one refusal a way, padding cost
        return sum(4 + len(bucket_ways(_model(profile, f), profile.seed)) for f in shaped_families(profile))

    def run(self, context: StudyContext) -> StudyReport:
        profile = context.profile
        lines = ["# Shapes as served", ""]
        figures: dict[str, dict] = {}
        context.workdir.mkdir(parents=True, exist_ok=True)
        for family in shaped_families(profile):
            with tempfile.TemporaryDirectory(prefix="shapes-", dir=context.workdir) as scratch:
                ways, runs = self._family(context, _model(profile, family), Path(scratch))
            pick = choose(runs).name
            figures[family] = {"lengths": ways.mix.describe(), "runs": [run_figures(run) for run in runs],
                               "pick": pick, "not_offered": ways.refused}  # fmt: skip
            lines += family_lines(family, ways, runs, pick, profile)
        return write_report(context, self, lines, [], figures)

    def _family(self, context: StudyContext, model: ModelSpec, scratch: Path) -> tuple[Ways, list[BucketRun]]:
        profile = context.profile
        repository = scratch / "repository"
        context.progress(f"building {model.name}")
        build_repository(Spec((model,)), repository, num_gpus=0)
        load = closed_loop(profile.goal_concurrency)
        ways = ways_of(model, repository / model.name / "1" / "model.onnx", profile.seed)
        for name in ways.refused:  # the steps counted them: say why they are not measured
            context.progress(f"{model.name}, {name}: not measured (padding changes the answer)")
        context.progress("starting tritonserver")
        with context.server(repository, f"{model.name}-server.log") as server:
            url = context.url(server)

            def send(buckets: tuple[int, ...] | None) -> Target:
                return target_from_spec(model, url, profile.protocol, seed=profile.seed, rows=MAX_BATCH,
                                        vary_shapes=buckets is not None, buckets=buckets)  # fmt: skip

            def measure(target: Target, name: str, length: int) -> Measurement:
                label = f"{model.name} at one length ({length})" if length else f"{model.name}, {name}"
                return context.measure(server, target, load, label)

            runs = ways.measure(send, measure)
        context.progress("padding cost (raw compute)")
        return ways, ways.priced(runs)


def family_lines(family: str, ways: Ways, runs: list[BucketRun], pick: str, profile: Profile) -> list[str]:
    """One model's markdown: the runs side by side, the bucket sets not offered, per-length tables."""
    single = next(run.measured.figures.throughput for run in runs if run.buckets is None)
    header = ["sent", "lengths", "inf/s", "× one length", "p50 ms", "p99 ms", "failed", "mean batch (Triton)",
              "padding: compute ×", "padded share"]  # fmt: skip
    rows = []
    for run in runs:
        figures = run.measured.figures
        gain = figures.throughput / single if single else float("nan")
        name = run.name + (" (pick)" if run.name == pick else "")
        rows.append([name, sent(run), number(figures.throughput, 0),
                     ratio(gain), number(figures.p50_ms), number(figures.p99_ms), figures.failed,
                     number(run.measured.stats.mean_batch, 2), *run.padding_cells()])  # fmt: skip
    lines = [
        f"## {family}",
        "",
        f"Request lengths: {ways.mix.describe()}. Dynamic batching ({DELAY_US // 1000} ms), closed loop at "
        f"concurrency {profile.goal_concurrency} over {profile.protocol}; the same load every run. Triton "
        "merges only requests of equal shapes: the one-length run is what a single-length measurement "
        "promises.",
        "",
        table(header, rows),
        "",
        f"Pick: **{pick}** (the most served of the ways that send the traffic's lengths). Padding cost: raw "
        f"compute of the padded lengths over the true ones, one onnxruntime thread, batch {PADDING_BATCH}.",
        "",
        *(line + "\n" for line in refused_lines(ways.refused)),
    ]
    for run in runs:
        batches = sorted(run.measured.stats.batches.items())
        executions = ", ".join(f"{size}: {b.executions}" for size, b in batches) or "none read"
        lines += [
            *run.formed_lines(MAX_BATCH),
            "",
            f"Triton's executions per batch size (all lengths): {executions}. Formed batches per length: "
            "responses of one length that arrive together, scaled to sum to Triton's executions.",
            "",
        ]
    return lines
