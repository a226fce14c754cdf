"""The tuner's saved result: one JSON document (``result.json``) with every figure of a run, from which
the report is rendered (``perf.tune.report``), now or later, and which other tools read.

Each measured run is saved with the figures a reader judges it by, and with the host-noise policy's
verdict on it (``host_noise``: its stolen share reached the policy's limit, so the figure holds the
host's other work as well as the configuration).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from perf.markdown import plain
from perf.measure.measurement import Measurement
from perf.measure.noise import NoisePolicy
from perf.model.predict import Prediction
from perf.tune.tuner import Point, TuneResult

RESULT_FILE = "result.json"


def _finite(value: float) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None


def run_figures(run: Measurement, noise: NoisePolicy) -> dict:
    """One measured run as saved."""
    summary = run.figures
    cpu = run.server.cpu_load() if run.server else (math.nan, math.nan, math.nan)
    return {
        "label": run.label,
        "offered": run.offered,
        "served": summary.throughput,
        "p50_ms": _finite(summary.p50_ms),
        "p99_ms": _finite(summary.p99_ms),
        "sent": summary.requests,
        "failed": summary.failed,
        "met_rate": run.sustained,
        "stable": run.stable,
        "mean_batch": run.stats.mean_batch,
        "batches": {str(size): bucket.executions for size, bucket in sorted(run.stats.batches.items())},
        "cpu_cores": _finite(cpu[2]),
        "stolen_pct": _finite(100 * run.stolen_share),
        "host_noise": noise.holds_noise(run),
        "engine": run.engine,
    }


def prediction_figures(prediction: Prediction | None, cores: int) -> dict | None:
    if prediction is None:
        return None
    return {
        "rate": prediction.rate,
        "p99_ms": prediction.p99_ms,
        "served": prediction.throughput,
        "mean_batch": prediction.mean_batch,
        "met_rate": prediction.sustained,
        "cpu_cores": prediction.cpu_utilization * cores,
    }


def point_figures(point: Point, noise: NoisePolicy, cores: int) -> dict:
    return {
        "config": point.config.label,
        "rate": point.rate,
        "predicted": prediction_figures(point.predicted, cores),
        "measured": run_figures(point.measured, noise) if point.measured else None,
    }


def document(result: TuneResult, model: str, engine: str, noise: NoisePolicy, cores: int) -> dict:
    """Every figure of ``result`` (``engine``: the load engine's name; ``cores``: the CPU term's)."""
    request, probe = result.request, result.probe
    chosen = next(r for r in result.ranking if r.config == result.chosen)
    operating = result.operating_point
    cpu = probe.cpu
    return {
        "model": model,
        "budget_ms": request.budget_ms,
        "target_rate": request.rate,
        "engine": engine,
        "chosen": result.chosen.label,
        "model_pick": result.ranking[0].config.label,
        "operating_rate": result.operating_rate,
        "predicted_max_rate": chosen.rate,
        "measured_max_rate": result.measured_rate,
        "operating": point_figures(operating, noise, cores),
        "seconds": {
            "probe": probe.seconds,
            "predict": result.predict_s,
            "shortlist": result.shortlist_s,
            "verify": result.verify_s,
            "tuner": result.tuner_s,
        },
        "probe": {
            "fits": {str(n): {"t_ms": f.t_ms, "dt_ms": f.dt_ms, "r2": f.r2} for n, f in probe.fits.items()},
            "per_batch_ms": probe.per_batch_ms,
            "per_request_ms": {str(n): ms for n, ms in probe.per_request_ms.items()},
            "overhead_ms": probe.overhead_ms,
            "floor_p99_ms": probe.floor_p99_ms,
            "cpu": None
            if cpu is None
            else {
                "idle_cores": cpu.idle_cores,
                "per_request_us": 1e6 * cpu.per_request_s,
                "per_execution_us": 1e6 * cpu.per_execution_s,
                "cores": cpu.cores,
                "slice_ms": {str(n): 1e3 * s.cpu.slice_s for n, s in probe.services.items() if s.cpu},
            },
            "runs": [{"config": c.label, **run_figures(run, noise)} for c, run in probe.runs],
        },
        "candidates": [
            {
                "config": r.config.label,
                "feasible": r.feasible(request),
                "best": prediction_figures(r.best, cores),
                "at_rate": prediction_figures(r.at_rate, cores),
            }
            for r in result.ranking
        ],
        "shortlist": [
            {
                "config": c.config.label,
                "predicted_rate": c.predicted_rate,
                "measured_rate": c.rate,
                "seconds": c.seconds,
                "points": [point_figures(p, noise, cores) for p in c.points],
            }
            for c in result.shortlist
        ],
        "verification": [point_figures(p, noise, cores) for p in result.points],
        # picks the verification demoted: each measured over the budget at its operating rate
        "demoted": [point_figures(p, noise, cores) for p in result.demoted],
        "noise": noise.figures(),
        "sections": [],  # tools beside the tuner (the perf_analyzer witness) add rendered sections here
    }


def save(folder: Path, saved: dict) -> Path:
    path = folder / RESULT_FILE
    path.write_text(json.dumps(saved, indent=1, default=plain))
    return path


def load(folder: Path) -> dict:
    return json.loads((folder / RESULT_FILE).read_text())
