"""The pipeline study: each pipeline against its monolithic model, in one run on one server, as ratios
within the run (docs/PIPELINE.md): saturation, a fixed load, per step, and live updates."""

from __future__ import annotations

import copy
import logging
import math
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from client.infer import make_inputs
from exporters.pipelines.build import PipelineRecord, build_pipelines
from exporters.pipelines.live import embedding_update, publish_dense_version
from exporters.repository import build_repository
from exporters.schema.bounded_yaml import load_spec_document
from exporters.schema.models import Spec, parse_spec
from exporters.sources.load import build_torch_model
from perf.errors import StudyError
from perf.markdown import table
from perf.measure.loads import Load, closed_loop
from perf.measure.records import Summary
from perf.measure.server_view import ServerDelta
from perf.studies.framework import StudyContext, StudyReport, write_report
from perf.studies.goals import GOALS, Goal, goals_table
from perf.studies.profiles import Profile
from perf.studies.study_spec import COMPARISONS, LIVE_PIPELINE, VARIANTS, Comparison
from server import TritonServer
from server.admin import headers as admin_headers

log = logging.getLogger(__name__)
DENSE_VERSION, DENSE_SEED = 2, 99  # the version the live phase publishes, and its weights' seed
UPDATE_ROWS = 8  # embedding rows per update request


@dataclass(frozen=True)
class Step:
    """Queue and compute per request of one step of an ensemble (server statistics)."""

    step: str
    queue_ms: float
    compute_ms: float
    mean_batch: float


@dataclass(frozen=True)
class Row:
    comparison: Comparison
    saturation_model: float  # inf/s
    saturation_pipeline: float
    fixed_model: Summary  # the client's view of each under the fixed load
    fixed_pipeline: Summary
    steps: list[Step]
    record: PipelineRecord

    @property
    def saturation_ratio(self) -> float:
        return self.saturation_pipeline / self.saturation_model if self.saturation_model else math.nan

    @property
    def added_p50_per_boundary(self) -> float:
        added = self.fixed_pipeline.p50_ms - self.fixed_model.p50_ms
        return added / self.comparison.boundaries if self.comparison.boundaries else math.nan


@dataclass
class Live:
    """The pipeline under fixed load while its parameters change (the updater counts into it)."""

    figures: Summary | None = None
    updates_applied: int = 0
    dense_swapped: bool = False
    shed: int = 0  # of the failed: arrivals the client shed because the pipeline fell behind

    @property
    def complete(self) -> bool:
        return self.dense_swapped and self.updates_applied > 0


def runs_live(profile: Profile) -> bool:
    """Whether the live phase runs: its pipeline is compared, and updates are asked for."""
    return LIVE_PIPELINE in profile.pipelines and profile.live_updates > 0


def fixed_load(context: StudyContext, model: str, capacity: float, seed_offset: int) -> Load:
    """The fixed load of a comparison: a share of the monolithic model's capacity (or the trace)."""
    if capacity <= 0 and not context.profile.trace:
        raise StudyError(f"{model} answered nothing at saturation; no capacity to set the fixed load from")
    return context.open_load(context.profile.pipeline_load_fraction * capacity, seed_offset)


def steps_of(delta: ServerDelta, stages: list[str]) -> list[Step]:
    """Per stage, then the ensemble's own share (its request time minus the stages')."""
    steps = [
        Step(name, s.queue_ms_per_request, s.compute_ms_per_request, s.mean_batch)
        for name in stages
        for s in (delta.related[name],)
    ]
    if stages and delta.stats.requests:
        inside = sum(s.queue_ms + s.compute_ms for s in steps)
        between = max(delta.stats.request_ms_per_request - inside, 0.0)
        steps.append(Step("ensemble (between steps)", 0.0, between, math.nan))
    return steps


def study_spec(spec_path: Path, wanted: list[Comparison]) -> Spec:
    """The user's spec's models and pipelines that the comparisons need, plus the study variants."""
    data = load_spec_document(spec_path)  # the bounded reader every spec goes through
    pipelines = {c.pipeline for c in wanted}
    models = {c.model for c in wanted}
    data["models"] = [m for m in data["models"] if m["name"] in models]
    data["pipelines"] = [
        p for p in [*data.get("pipelines", []), *copy.deepcopy(VARIANTS)] if p["name"] in pipelines
    ]
    return parse_spec(data)


class PipelineStudy:
    name = "pipeline"
    title = "pipeline study (ensembles of stages vs their monolithic models)"
    serves_spec = True  # the pipelines of the user's spec

    def steps(self, profile: Profile) -> int:
        wanted = [COMPARISONS[name] for name in profile.pipelines]
        if not wanted:
            return 0
        return 2 + 2 * len({c.model for c in wanted}) + 2 * len(wanted) + runs_live(profile)

    def run(self, context: StudyContext) -> StudyReport:
        """A fresh repository per run: the live phase writes a new version into it, and two studies
        running at once must not rebuild each other's."""
        context.workdir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="pipeline-study-", dir=context.workdir) as scratch:
            rows, live = self._measure(context, Path(scratch) / "repository")
        return write_pipeline_report(context, self, rows, live)

    def _measure(self, context: StudyContext, repository: Path) -> tuple[list[Row], Live | None]:
        profile = context.profile
        wanted = [COMPARISONS[name] for name in profile.pipelines]
        spec = study_spec(context.spec_path, wanted)
        context.progress("building the pipeline study repository")
        build_repository(spec, repository, num_gpus=0)
        records = {b.spec.name: b.record for b in build_pipelines(spec, repository, num_gpus=0)}
        context.progress("starting tritonserver (explicit model control)")
        saturate = closed_loop(profile.goal_concurrency)
        with context.server(repository, "pipeline-server.log", startup_timeout_s=300) as server:
            capacity: dict[str, float] = {}
            fixed: dict[str, tuple[Load, Summary]] = {}  # each model's fixed load, and its figures under it
            for model in sorted({c.model for c in wanted}):
                target = context.target(server, spec.model(model))
                capacity[model] = context.measure(server, target, saturate).throughput
                load = fixed_load(context, model, capacity[model], seed_offset=1)
                fixed[model] = load, context.measure(server, target, load).summary()
            rows = []
            for c in wanted:
                target = context.target(server, spec.model(c.model), served_as=c.pipeline)
                stages = list(spec.pipeline(c.pipeline).stage_names)
                (load, model_figures), sat = fixed[c.model], context.measure(server, target, saturate)
                low = context.measure(server, target, load, related=stages)
                steps = steps_of(low.server, stages) if low.server else []
                rows.append(
                    Row(c, capacity[c.model], sat.throughput, model_figures, low.summary(),
                        steps, records[c.pipeline])
                )  # fmt: skip
            live = _measure_live(context, server, spec, repository, capacity) if runs_live(profile) else None
        return rows, live


def _send_updates(
    url: str, admin_key: str, repository: Path, spec: Spec, count: int, live: Live, timeout_s: float
) -> None:
    pipeline = spec.pipeline(LIVE_PIPELINE)
    model_spec = spec.model(pipeline.model)
    embedding, dense = pipeline.stage_names
    # the dense version loads as a server start's models do: a loaded host may take minutes, not 60 s
    with httpclient.InferenceServerClient(url, network_timeout=timeout_s) as client:
        try:
            rng = np.random.default_rng(0)
            model = build_torch_model(model_spec)
            for index in range(count):
                table_index = index % len(model.table_sizes)
                rows = rng.integers(0, model.table_sizes[table_index], size=UPDATE_ROWS)
                width = model.embed.tables[table_index].embedding_dim
                values = rng.standard_normal((UPDATE_ROWS, width)).astype(np.float32)
                client.infer(embedding, make_inputs(httpclient, embedding_update(table_index, rows, values)))
                live.updates_applied += 1
                time.sleep(0.05)
            publish_dense_version(pipeline, model_spec, repository, version=DENSE_VERSION, seed=DENSE_SEED)
            client.load_model(dense, headers=admin_headers(admin_key))
            live.dense_swapped = client.is_model_ready(dense, str(DENSE_VERSION))
        except Exception:  # the report says the phase was incomplete
            log.exception("live updates failed: the live phase is incomplete")


def _measure_live(
    context: StudyContext, server: TritonServer, spec: Spec, repository: Path, capacity: dict[str, float]
) -> Live:
    model = COMPARISONS[LIVE_PIPELINE].model
    live = Live()
    args = (server.http_url, server.admin_key, repository, spec, context.profile.live_updates, live)
    timeout_s = server.options.startup_timeout_s
    updater = threading.Thread(target=_send_updates, args=args, kwargs={"timeout_s": timeout_s}, daemon=True)
    target = context.target(server, spec.model(model), served_as=LIVE_PIPELINE)
    load = fixed_load(context, model, capacity[model], seed_offset=2)
    updater.start()
    measurement = context.measure(server, target, load, f"{LIVE_PIPELINE} during live updates")
    updater.join(timeout=timeout_s)
    shed = sum(r.shed for r in measurement.measured_records())
    return replace(live, figures=measurement.summary(), shed=shed)  # a copy: a running updater counts on


def pipeline_goals(rows: list[Row], live: Live | None) -> list[Goal]:
    goals = []
    for r in rows:
        c = r.comparison
        if "pipeline saturation" in c.goals:
            spec = GOALS["pipeline saturation"]
            goals.append(Goal(f"{c.pipeline} saturation", spec.target(model=c.model),
                              f"{r.saturation_ratio:.2f}×", spec.met(r.saturation_ratio)))  # fmt: skip
        if "added p50 per boundary" in c.goals:
            spec, added = GOALS["added p50 per boundary"], r.added_p50_per_boundary
            goals.append(Goal(f"{c.pipeline} added p50", spec.target(), f"{added:+.2f} ms", spec.met(added)))
    if live is not None:
        spec = GOALS["failed during live updates"]
        measured = (
            f"{live.figures.failed}/{live.figures.requests} failed; {live.updates_applied} updates applied, "
            f"dense v{DENSE_VERSION} {'live' if live.dense_swapped else 'NOT swapped'}"
        )
        met = spec.met(live.figures.failed) if live.complete else None
        limits = "" if live.complete else "incomplete: the updates or the version swap did not finish"
        failed, shed = live.figures.failed, live.shed
        if shed:
            note = f"{shed} of the {failed} failed were arrivals shed by the client (every slot busy)"
            if shed == failed:
                note += ": the pipeline fell behind the load, no request was refused by the server"
            limits = f"{limits}; {note}" if limits else note
        goals.append(Goal(f"{LIVE_PIPELINE} live updates", spec.target(), measured, met, limits))
    return goals


def write_pipeline_report(
    context: StudyContext, study: PipelineStudy, rows: list[Row], live: Live | None
) -> StudyReport:
    """``pipeline.md`` (tables and goals) and ``pipeline.json`` (every figure)."""
    p = context.profile
    load = f"the trace {p.trace}" if p.trace else "Poisson arrivals"
    lines = [
        "# Pipeline study",
        "",
        f"Closed loop at concurrency {p.goal_concurrency} (saturation); {load} at "
        f"{p.pipeline_load_fraction:.0%} of the monolithic model's capacity (fixed load), the same for both. "
        f"Protocol {p.protocol}{' + system shared memory' if p.shared_memory else ''}; windows "
        f"{p.settings.window_s} s (warm-up {p.settings.warmup_s} s, at most {p.settings.max_windows}).",
        "",
    ]
    header = ["pipeline", "vs", "role", "QPS ratio (sat.)", "p50 ms model → pipeline",
              "p99 ms model → pipeline", "added p50 / boundary ms", "boundary bytes/req (saved)",
              "compression err", "failed/sent"]  # fmt: skip
    body = []
    for r in rows:
        c, fm, fp, rec = r.comparison, r.fixed_model, r.fixed_pipeline, r.record
        added = r.added_p50_per_boundary
        body.append([
            c.pipeline, c.model, c.role, f"{r.saturation_ratio:.2f}",
            f"{fm.p50_ms:.2f} → {fp.p50_ms:.2f}", f"{fm.p99_ms:.2f} → {fp.p99_ms:.2f}",
            "—" if math.isnan(added) else f"{added:+.2f}",
            f"{rec.boundary_bytes_per_request} ({rec.boundary_bytes_saved_per_request})",
            f"{rec.compression_max_rel_error:.1e}", f"{fp.failed}/{fp.requests}",
        ])  # fmt: skip
    lines += [table(header, body), "", "## Per step (server statistics, fixed load)", ""]
    step_rows = [
        [r.comparison.pipeline, s.step, f"{s.queue_ms:.3f}", f"{s.compute_ms:.3f}",
         "" if math.isnan(s.mean_batch) else f"{s.mean_batch:.1f}"]
        for r in rows
        for s in r.steps
    ]  # fmt: skip
    lines += [table(["pipeline", "step", "queue ms/req", "compute ms/req", "mean batch"], step_rows), ""]
    goals = pipeline_goals(rows, live)
    lines += ["## Goals", "", goals_table(goals)]
    figures = {"profile": asdict(p), "rows": [asdict(r) for r in rows], "live": live and asdict(live)}
    return write_report(context, study, lines, goals, figures)
