"""The pipeline study: each pipeline against its monolithic model, in one run on one server.

What it measures (docs/PIPELINE.md), all as ratios within the run because the machine is shared:

* **saturation**: a closed loop at ``concurrency`` → throughput of the pipeline / the monolithic model;
* **fixed load**: the same seeded Poisson arrivals (``load_fraction`` of the monolithic capacity) for
  both → p50 and p99, and the **added p50 per stage boundary** ((p50 pipeline − p50 model) / boundaries);
* **per step**, from server statistics: queue and compute per request of every stage, and what the
  ensemble adds on top (its request time minus the stages' queue + compute);
* **boundary compression** (fp16 against fp32 boundaries, same cuts) and **replicas per stage**;
* **live updates**: failed / sent under fixed load while embedding rows are updated and the dense stage
  is swapped to a new version (the server runs with explicit model control for this).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import logging
import math
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.http as httpclient
import yaml
from tritonclient.utils import np_to_triton_dtype

from client.stats import ModelStats, parse_model_stats
from exporters.onnx_export import build_torch_model
from exporters.pipeline_build import build_pipelines
from exporters.pipeline_live import embedding_update, publish_dense_version
from exporters.repository import build_repository
from exporters.spec import Spec, parse_spec
from perf.loads import closed_loop, poisson
from perf.markdown import table
from perf.measure import Measurement, MeasureSettings, measure
from perf.target import target_from_spec
from server import ServerOptions, TritonServer
from server.admin import headers as admin_headers

log = logging.getLogger(__name__)
SPEC = Path("models.yaml")


@dataclass(frozen=True)
class Comparison:
    """A pipeline measured against ``model``; ``boundaries`` = stages − 1."""

    pipeline: str
    model: str
    boundaries: int
    role: str  # what the row shows: "pipeline", "fp16 boundaries", "replicas [1, 2]", ...


@dataclass(frozen=True)
class PipelineStudyPlan:
    comparisons: tuple[Comparison, ...]
    concurrency: int = 16
    load_fraction: float = 0.5
    settings: MeasureSettings = field(
        default_factory=lambda: MeasureSettings(warmup_s=1.0, window_s=1.25, stable_windows=3, max_windows=5)
    )
    live_updates: int = 20


# Study-only variants of the shipped pipelines, built into the study's own repository.
VARIANTS = [
    {
        "name": "recommender_pipeline_fp16b",
        "model": "recommender",
        "split": "embedding_dense",
        "boundary_dtype": "fp16",
    },
    {
        "name": "image_classifier_pipeline_r12",
        "model": "image_classifier",
        "split": "blocks",
        "stages": 2,
        "replicas": [1, 2],
    },
    {"name": "image_classifier_torch", "model": "image_classifier", "split": "blocks", "stages": 1},
]
REC = (
    Comparison("recommender_pipeline", "recommender", 1, "pipeline (embedding | dense)"),
    Comparison("recommender_pipeline_fp16b", "recommender", 1, "fp16 boundary"),
)
IMAGE = (
    Comparison("image_classifier_pipeline", "image_classifier", 1, "pipeline (2 stages, auto split)"),
    Comparison("image_classifier_pipeline_fp16", "image_classifier", 1, "fp16 boundary"),
    Comparison("image_classifier_pipeline_r12", "image_classifier", 1, "replicas [1, 2]"),
    Comparison("image_classifier_torch", "image_classifier", 0, "1 stage, same torch runner"),
)
PLANS = {
    "default": PipelineStudyPlan(REC + IMAGE),
    "quick": PipelineStudyPlan(
        (REC[0], IMAGE[0], IMAGE[1]),
        settings=MeasureSettings(warmup_s=0.5, window_s=0.75, stable_windows=3, max_windows=3),
        live_updates=10,
    ),
}


@dataclass
class Row:
    comparison: Comparison
    saturation: dict[str, float] = field(default_factory=dict)  # model/pipeline → inf/s
    fixed: dict[str, dict[str, float]] = field(default_factory=dict)  # model/pipeline → p50, p99, failed
    steps: list[dict[str, Any]] = field(default_factory=list)  # per stage: queue/compute ms per request
    record: dict[str, Any] = field(default_factory=dict)  # pipeline.json


def study_spec(spec_path: Path, comparisons: tuple[Comparison, ...]) -> Spec:
    """The shipped spec's models and pipelines that the comparisons need, plus the study variants."""
    data = yaml.safe_load(spec_path.read_text())
    wanted = {c.pipeline for c in comparisons}
    models = {c.model for c in comparisons}
    data["models"] = [m for m in data["models"] if m["name"] in models]
    data["pipelines"] = [
        p for p in [*data.get("pipelines", []), *copy.deepcopy(VARIANTS)] if p["name"] in wanted
    ]
    return parse_spec(data)


def _stats(client: httpclient.InferenceServerClient, model: str) -> tuple[ModelStats, int]:
    """The model's counters and its total successful request time in ns (the ensemble's end to end)."""
    payload = client.get_inference_statistics(model)
    success_ns = sum(int(m["inference_stats"]["success"]["ns"]) for m in payload["model_stats"])
    return parse_model_stats(payload), success_ns


def _measure_with_steps(
    client: httpclient.InferenceServerClient, target, load, settings: MeasureSettings, stages: list[str]
) -> tuple[Measurement, list[dict[str, Any]]]:
    """One measurement plus, per stage, queue and compute per request over it (and the ensemble's rest)."""
    names = [target.model, *stages]
    before = {name: _stats(client, name) for name in names}
    measurement = measure(target, load, settings, label=f"{target.model} {load.name}")
    after = {name: _stats(client, name) for name in names}
    steps = []
    ensemble_requests = after[target.model][0].requests - before[target.model][0].requests
    inside = 0.0
    for name in stages:
        stats = after[name][0] - before[name][0]
        steps.append(
            {
                "step": name,
                "queue_ms": stats.queue_ms_per_request,
                "compute_ms": stats.compute_ms_per_request,
                "mean_batch": stats.mean_batch,
            }
        )
        inside += stats.queue_ms_per_request + stats.compute_ms_per_request
    if stages and ensemble_requests:
        total_ms = (after[target.model][1] - before[target.model][1]) / ensemble_requests / 1e6
        steps.append(
            {
                "step": "ensemble (between steps)",
                "queue_ms": 0.0,
                "compute_ms": max(total_ms - inside, 0.0),
                "mean_batch": math.nan,
            }
        )
    return measurement, steps


def _figures(measurement: Measurement) -> dict[str, float]:
    summary = measurement.summary()
    return {
        "throughput": summary.throughput,
        "p50_ms": summary.p50_ms,
        "p99_ms": summary.p99_ms,
        "failed": summary.failed,
        "sent": summary.requests,
    }


def _target(spec: Spec, model: str, url: str, name: str | None = None):
    target = target_from_spec(spec.model(model), url, protocol="grpc", rows=64)
    return dataclasses.replace(target, model=name or model)


def _live_updates(
    url: str,
    admin_key: str,
    repository: Path,
    spec: Spec,
    count: int,
    done: threading.Event,
    outcome: dict[str, float],
) -> None:
    """Embedding row updates, then a new dense version loaded, while the load runs."""
    client = httpclient.InferenceServerClient(url)
    try:
        rng = np.random.default_rng(0)
        model = build_torch_model(spec.model("recommender"))
        for index in range(count):
            table = index % len(model.table_sizes)
            rows = rng.integers(0, model.table_sizes[table], size=8)
            values = rng.standard_normal((8, model.embed.tables[table].embedding_dim)).astype(np.float32)
            update = embedding_update(table, rows, values)
            inputs = []
            for name, array in update.items():
                tensor = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
                tensor.set_data_from_numpy(array)
                inputs.append(tensor)
            client.infer("recommender_pipeline_embedding", inputs)
            outcome["updates_applied"] += 1
            done.wait(0.05)
        pipeline = spec.pipeline("recommender_pipeline")
        publish_dense_version(pipeline, spec.model("recommender"), repository, version=2, seed=99)
        client.load_model("recommender_pipeline_dense", headers=admin_headers(admin_key))
        outcome["dense_swapped"] = float(client.is_model_ready("recommender_pipeline_dense", "2"))
    finally:
        client.close()
        done.set()


def run_pipeline_study(profile_name: str, folder: Path, workdir: Path = Path(".run")) -> Path | None:
    """Build, serve, measure, write ``pipeline.md`` / ``pipeline.json`` into ``folder``; None if skipped.

    The repository is built in a fresh folder per run (removed afterwards): the live phase writes a new
    dense version into it, and two studies running at once must not rebuild each other's repository.
    """
    plan = PLANS.get(profile_name)
    if plan is None:
        log.info("pipeline study: no plan for profile %s; skipped", profile_name)
        return None
    workdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pipeline-study-", dir=workdir) as scratch:
        return _study(plan, folder, Path(scratch) / "repository")


def _study(plan: PipelineStudyPlan, folder: Path, repository: Path) -> Path:
    spec = study_spec(SPEC, plan.comparisons)
    build_repository(spec, repository, num_gpus=0)
    records = {b.spec.name: b.record for b in build_pipelines(spec, repository, num_gpus=0)}
    options = ServerOptions(
        repository=repository,
        model_control_mode="explicit",
        log_path=folder / "pipeline-server.log",
        startup_timeout_s=300,
    )
    rows: list[Row] = []
    live: dict[str, float] = {}
    with TritonServer(options) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        try:
            saturation: dict[str, float] = {}
            fixed: dict[str, dict[str, float]] = {}
            for model in sorted({c.model for c in plan.comparisons}):
                target = _target(spec, model, server.grpc_url)
                saturation[model] = _figures(measure(target, closed_loop(plan.concurrency), plan.settings))[
                    "throughput"
                ]
                fixed[model] = _figures(
                    measure(target, poisson(plan.load_fraction * saturation[model], seed=1), plan.settings)
                )
            for comparison in plan.comparisons:
                row = Row(comparison, record=records[comparison.pipeline])
                stages = list(spec.pipeline(comparison.pipeline).stage_names)
                target = _target(spec, comparison.model, server.grpc_url, comparison.pipeline)
                sat, _ = _measure_with_steps(
                    client, target, closed_loop(plan.concurrency), plan.settings, stages
                )
                rate = plan.load_fraction * saturation[comparison.model]
                low, row.steps = _measure_with_steps(
                    client, target, poisson(rate, seed=1), plan.settings, stages
                )
                row.saturation = {
                    "model": saturation[comparison.model],
                    "pipeline": _figures(sat)["throughput"],
                }
                row.fixed = {"model": fixed[comparison.model], "pipeline": _figures(low)}
                rows.append(row)
            if any(c.pipeline == "recommender_pipeline" for c in plan.comparisons):
                live = _measure_live(spec, server, repository, plan, saturation["recommender"])
        finally:
            client.close()
    return write_pipeline_report(folder, plan, rows, live)


def _measure_live(
    spec: Spec, server: TritonServer, repository: Path, plan: PipelineStudyPlan, capacity: float
):
    done = threading.Event()
    outcome = {"updates_applied": 0.0, "dense_swapped": 0.0}
    target = _target(spec, "recommender", server.grpc_url, "recommender_pipeline")
    args = (server.http_url, server.admin_key, repository, spec, plan.live_updates, done, outcome)
    updater = threading.Thread(target=_live_updates, args=args, daemon=True)
    updater.start()
    measurement = measure(target, poisson(plan.load_fraction * capacity, seed=2), plan.settings)
    updater.join(timeout=120)
    figures = _figures(measurement)
    return {**figures, **outcome}


def _goal(value: float, limit: float, higher_is_better: bool) -> str:
    if math.isnan(value):
        return "n/a"
    return "met" if (value >= limit if higher_is_better else value <= limit) else "MISSED"


def write_pipeline_report(
    folder: Path, plan: PipelineStudyPlan, rows: list[Row], live: dict[str, float]
) -> Path:
    """``pipeline.md`` (tables and goals) and ``pipeline.json`` (every figure) in ``folder``."""
    everything = {
        "plan": dataclasses.asdict(plan),
        "rows": [dataclasses.asdict(r) for r in rows],
        "live": live,
    }
    (folder / "pipeline.json").write_text(
        json.dumps(everything, indent=2, default=str)
    )  # first: the raw figures
    lines = [
        "# Pipeline study",
        "",
        f"Closed loop at concurrency {plan.concurrency} (saturation); Poisson arrivals at "
        f"{plan.load_fraction:.0%} of the monolithic model's capacity (fixed load), the same for both.",
        "",
    ]
    header = [
        "pipeline",
        "vs",
        "role",
        "QPS ratio (sat.)",
        "p50 ms model → pipeline",
        "p99 ms model → pipeline",
        "added p50 / boundary ms",
        "boundary bytes/req (saved)",
        "compression err",
        "failed/sent",
    ]
    body = []
    for r in rows:
        c, fm, fp = r.comparison, r.fixed["model"], r.fixed["pipeline"]
        added = (fp["p50_ms"] - fm["p50_ms"]) / c.boundaries if c.boundaries else math.nan
        body.append(
            [
                c.pipeline,
                c.model,
                c.role,
                f"{r.saturation['pipeline'] / r.saturation['model']:.2f}",
                f"{fm['p50_ms']:.2f} → {fp['p50_ms']:.2f}",
                f"{fm['p99_ms']:.2f} → {fp['p99_ms']:.2f}",
                "—" if math.isnan(added) else f"{added:+.2f}",
                f"{r.record['boundary_bytes_per_request']} ({r.record['boundary_bytes_saved_per_request']})",
                f"{r.record['compression_max_rel_error']:.1e}",
                f"{fp['failed']:.0f}/{fp['sent']:.0f}",
            ]
        )
    lines += [table(header, body), "", "## Per step (server statistics, fixed load)", ""]
    step_rows = [
        [
            r.comparison.pipeline,
            s["step"],
            f"{s['queue_ms']:.3f}",
            f"{s['compute_ms']:.3f}",
            "" if math.isnan(s["mean_batch"]) else f"{s['mean_batch']:.1f}",
        ]
        for r in rows
        for s in r.steps
    ]
    lines += [table(["pipeline", "step", "queue ms/req", "compute ms/req", "mean batch"], step_rows), ""]
    goals = []
    for r in rows:
        if r.comparison.role.startswith("pipeline"):
            ratio = r.saturation["pipeline"] / r.saturation["model"]
            goals.append(
                [
                    f"{r.comparison.pipeline}: throughput at saturation ≥ 0.9× {r.comparison.model}",
                    f"{ratio:.2f}×",
                    _goal(ratio, 0.9, True),
                ]
            )
        if r.comparison.pipeline == "recommender_pipeline":
            added = r.fixed["pipeline"]["p50_ms"] - r.fixed["model"]["p50_ms"]
            goals.append(
                ["recommender: added p50 per boundary ≤ 0.5 ms", f"{added:+.2f} ms", _goal(added, 0.5, False)]
            )
    if live:
        what = "zero failed requests during embedding updates + a dense version swap"
        measured = (
            f"{live['failed']:.0f}/{live['sent']:.0f} failed; {live['updates_applied']:.0f} updates applied, "
            f"dense v2 {'live' if live['dense_swapped'] else 'NOT swapped'}"
        )
        complete = live["dense_swapped"] and live["updates_applied"] > 0
        goals.append([what, measured, _goal(-live["failed"], 0, True) if complete else "n/a (incomplete)"])
    lines += ["## Goals", "", table(["goal", "measured", "verdict"], goals), ""]
    path = folder / "pipeline.md"
    path.write_text("\n".join(lines))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perf.pipeline_study", description=__doc__)
    parser.add_argument("--profile", default="quick", choices=sorted(PLANS))
    parser.add_argument("--out", type=Path, default=Path("reports/pipeline"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    report = run_pipeline_study(args.profile, args.out)
    print(report.read_text() if report else "skipped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
