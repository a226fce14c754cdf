"""The tuner's saved result, ``result.json``: every figure of a run, as frozen dataclasses whose field
names are the file's keys (``perf.saved``), from which the report is rendered now or later. A step
after the tuner adds to it by building a new one, never by changing it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from perf.measure.measurement import Measurement
from perf.measure.noise import NoiseFigures, NoisePolicy
from perf.measure.raw import RawPoint
from perf.model.predict import Prediction
from perf.saved import load_document, save_document
from perf.tune.tuner import Point, TuneResult

RESULT_FILE = "result.json"


@dataclass(frozen=True)
class RunFigures:
    """One measured run as saved (``None``: a latency or CPU figure the run could not give)."""

    label: str
    offered: float
    served: float
    p50_ms: float | None
    p99_ms: float | None
    sent: int
    failed: int
    stable: bool
    mean_batch: float
    batches: dict[str, int]  # batch size -> executions Triton formed of it
    cpu_cores: float | None
    stolen_pct: float | None
    host_noise: bool
    engine: str
    # the requests its percentiles rest on, and whether they were too few to meet the budget by
    samples: int = field(default=0, kw_only=True)
    too_few: bool = field(default=False, kw_only=True)


@dataclass(frozen=True)
class ProbeRunFigures(RunFigures):
    """One of the probe's runs, with the configuration it ran."""

    config: str


@dataclass(frozen=True)
class PredictionFigures:
    rate: float
    p99_ms: float
    served: float
    mean_batch: float
    cpu_cores: float


@dataclass(frozen=True)
class PointFigures:
    """One configuration at one rate: predicted, and measured (its last run) with every run's p99 and
    whether it met the budget, so that a report shows the runs that disagree."""

    config: str
    rate: float
    predicted: PredictionFigures
    measured: RunFigures | None
    runs: int = 1
    verdict: str | None = None
    runs_p99_ms: tuple[float | None, ...] = ()  # every run's p99 in the order measured (the last: measured's)
    runs_met: tuple[bool, ...] = ()  # ... and whether it met the budget


@dataclass(frozen=True)
class Seconds:
    """Each step's wall time; ``make_tune``: the whole command, build and server start included."""

    probe: float
    predict: float
    shortlist: float
    verify: float
    tuner: float
    make_tune: float | None = None


@dataclass(frozen=True)
class FitFigures:
    """The probe's compute fit of one instance count: ``T + (batch - 1)·Δt`` ms."""

    t_ms: float
    dt_ms: float
    r2: float


@dataclass(frozen=True)
class CpuFigures:
    idle_cores: float
    per_request_us: float
    per_execution_us: float
    cores: int
    slice_ms: dict[str, float]  # instance count -> the CPU wait's slice


@dataclass(frozen=True)
class ProbeFigures:
    fits: dict[str, FitFigures]  # instance count -> compute fit
    per_batch_ms: float
    per_request_ms: dict[str, float]  # instance count -> per-request cost beyond compute
    overhead_ms: float
    floor_p99_ms: float
    cpu: CpuFigures | None
    runs: tuple[ProbeRunFigures, ...]


@dataclass(frozen=True)
class CandidateFigures:
    config: str
    feasible: bool
    best: PredictionFigures | None
    at_rate: PredictionFigures | None


@dataclass(frozen=True)
class ShortlistFigures:
    config: str
    predicted_rate: float
    measured_rate: float  # the highest rate it held the budget up to
    seconds: float
    points: tuple[PointFigures, ...]
    refuted_rate: float | None = None  # the lowest rate a miss of it stood at (``Evidence.refuted_at``)


@dataclass(frozen=True)
class TuneDocument:
    """``result.json``: every figure of one tune."""

    model: str
    budget_ms: float
    target_rate: float | None
    engine: str
    chosen: str
    model_pick: str
    operating_rate: float
    predicted_max_rate: float | None  # None: the answer is no candidate the prediction ranked
    measured_max_rate: float
    operating: PointFigures
    seconds: Seconds
    probe: ProbeFigures
    candidates: tuple[CandidateFigures, ...]
    shortlist: tuple[ShortlistFigures, ...]
    verification: tuple[PointFigures, ...]
    demoted: tuple[PointFigures, ...]  # answers a later run refuted: each missed the budget at its point
    noise: NoiseFigures
    sections: tuple[tuple[str, ...], ...] = ()  # rendered beside the tuner's own (the shapes step's)
    buckets: tuple[int, ...] | None = None  # chosen for a variable-length model (None: the spec's stay)
    raw: tuple[RawPoint, ...] = ()  # the raw backend, measured once the server stopped

    def with_section(self, lines: Sequence[str]) -> TuneDocument:
        """This document with one more report section after the tuner's own."""
        return replace(self, sections=(*self.sections, tuple(lines)))


def _finite(value: float) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None


def run_figures(run: Measurement, noise: NoisePolicy) -> RunFigures:
    """One measured run as saved."""
    summary = run.figures
    return RunFigures(
        label=run.label, offered=run.offered, served=summary.throughput, p50_ms=_finite(summary.p50_ms),
        p99_ms=_finite(summary.p99_ms), sent=summary.requests, failed=summary.failed, stable=run.stable,
        mean_batch=run.stats.mean_batch, cpu_cores=_finite(run.server.cpu_load()[2]) if run.server else None,
        batches={str(size): bucket.executions for size, bucket in sorted(run.stats.batches.items())},
        stolen_pct=_finite(100 * run.stolen_share), host_noise=noise.holds_noise(run), engine=run.engine,
        samples=run.samples, too_few=run.too_few,
    )  # fmt: skip


def prediction_figures(prediction: Prediction, cores: int) -> PredictionFigures:
    return PredictionFigures(
        rate=prediction.rate, p99_ms=prediction.p99_ms, served=prediction.throughput,
        mean_batch=prediction.mean_batch, cpu_cores=prediction.cpu_utilization * cores,
    )  # fmt: skip


def point_figures(point: Point, noise: NoisePolicy, cores: int) -> PointFigures:
    return PointFigures(
        config=point.config.label, rate=point.rate, predicted=prediction_figures(point.predicted, cores),
        measured=run_figures(point.measured, noise) if point.measured else None, runs=point.runs,
        verdict=point.verdict.value if point.verdict else None,
        runs_p99_ms=tuple(_finite(p99) for p99 in point.p99s), runs_met=point.mets,
    )  # fmt: skip


def probe_figures(result: TuneResult, noise: NoisePolicy) -> ProbeFigures:
    probe, cpu = result.probe, result.probe.cpu
    cpu_figures = None if cpu is None else CpuFigures(
        idle_cores=cpu.idle_cores, per_request_us=1e6 * cpu.per_request_s,
        per_execution_us=1e6 * cpu.per_execution_s, cores=cpu.cores,
        slice_ms={str(n): 1e3 * s.cpu.slice_s for n, s in probe.services.items() if s.cpu},
    )  # fmt: skip
    return ProbeFigures(
        fits={str(n): FitFigures(f.t_ms, f.dt_ms, f.r2) for n, f in probe.fits.items()},
        per_batch_ms=probe.per_batch_ms,
        per_request_ms={str(n): ms for n, ms in probe.per_request_ms.items()},
        overhead_ms=probe.overhead_ms, floor_p99_ms=probe.floor_p99_ms, cpu=cpu_figures,
        runs=tuple(ProbeRunFigures(**vars(run_figures(run, noise)), config=c.label) for c, run in probe.runs),
    )  # fmt: skip


def document(result: TuneResult, model: str, engine: str, noise: NoisePolicy, cores: int) -> TuneDocument:
    """Every figure of ``result`` (``engine``: the load engine's name; ``cores``: the CPU term's)."""
    request, probe, evidence = result.request, result.probe, result.evidence
    chosen = next((r for r in result.ranking if r.config == result.chosen), None)
    candidates = tuple(
        CandidateFigures(
            config=r.config.label, feasible=r.feasible(request),
            best=prediction_figures(r.best, cores) if r.best else None,
            at_rate=prediction_figures(r.at_rate, cores) if r.at_rate else None,
        )
        for r in result.ranking
    )  # fmt: skip
    shortlist = tuple(
        ShortlistFigures(
            config=c.config.label, predicted_rate=c.predicted_rate,
            measured_rate=evidence.held_rate(c.config), refuted_rate=_finite(evidence.refuted_at(c.config)),
            seconds=c.seconds, points=tuple(point_figures(p, noise, cores) for p in c.points),
        )
        for c in result.shortlist
    )  # fmt: skip
    seconds = Seconds(
        probe=probe.seconds, predict=result.predict_s, shortlist=result.shortlist_s, verify=result.verify_s,
        tuner=probe.seconds + result.predict_s + result.shortlist_s,  # the search, not the verification
    )  # fmt: skip
    return TuneDocument(
        model=model, budget_ms=request.budget_ms, target_rate=request.rate, engine=engine,
        chosen=result.chosen.label, measured_max_rate=result.measured_rate,
        model_pick=result.ranking[0].config.label if result.ranking else "no candidate",
        operating_rate=result.operating_rate, predicted_max_rate=chosen.rate if chosen else None,
        operating=point_figures(result.operating_point, noise, cores), seconds=seconds, shortlist=shortlist,
        probe=probe_figures(result, noise), candidates=candidates,
        verification=tuple(point_figures(p, noise, cores) for p in result.points),
        demoted=tuple(point_figures(p, noise, cores) for p in result.demoted), noise=noise.account(),
    )  # fmt: skip


def save(folder: Path, saved: TuneDocument) -> Path:
    """``saved`` as ``folder/result.json``."""
    return save_document(folder / RESULT_FILE, saved)


def load(folder: Path) -> TuneDocument:
    """``folder/result.json`` read back; an ``OptionError`` naming the field where it is not a tune's."""
    return load_document(folder / RESULT_FILE, TuneDocument)
