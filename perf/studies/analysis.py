"""The batching study's figures and goals, pure functions of the ``StudyResult``; serving overhead is
served minus raw in ms (a ratio hides the size of the cost), and a missed goal says what limits it."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from client.stats import BatchBucket, ModelStats
from perf import markdown
from perf.markdown import Unmeasured, error_percent, fit_text, number, percent, ratio, why_unmeasured
from perf.measure.measurement import Measurement
from perf.measure.raw import RawPoint
from perf.model.latency import LatencyFit, fit_latency
from perf.studies.goals import GOALS, Goal, all_met
from perf.studies.study import FamilyResult, StudyResult
from perf.studies.study_spec import MODES

CLIENT_BOUND = 0.8  # a result within 80% of the harness ceiling is flagged client-bound
MIN_EXECUTIONS = 5  # batch sizes seen fewer times are too noisy to fit
CORES = os.cpu_count() or 1


@dataclass(frozen=True)
class Row:
    """One measurement as a table row; ratios are to the family's no-batching row under the same load."""

    mode: str
    load: str
    throughput: float
    requests_per_s: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_batch: float
    sent: int
    failed: int
    stable: bool
    queue_ms: float
    compute_ms: float
    server_cpu_per_1000: float
    server_cores: float
    client_cores: float
    client_bound: bool
    ratios: dict[str, float]
    send_lag_p99_ms: float = float("nan")  # how late the client sent, after the last sample arrived
    outside_server_ms: float = float("nan")  # mean latency not spent in the server's queue or compute
    # A variable-length model: the padding's share of the positions computed, and computed per needed.
    padded_share: float = float("nan")
    padded_compute: float = float("nan")


def ceiling_rps(result: StudyResult, in_flight: int | None) -> float:
    """The harness's requests/s at the closest concurrency to ``in_flight`` (open loop: its best)."""
    if not result.ceiling:
        return float("inf")
    by_concurrency = {m.load.concurrency: m.figures.requests / m.figures.seconds for m in result.ceiling}
    if in_flight is None:
        return max(by_concurrency.values())
    closest = min(by_concurrency, key=lambda c: (abs(c - in_flight), -c))
    return by_concurrency[closest]


def row(result: StudyResult, mode: str, measurement: Measurement) -> Row:
    summary = measurement.summary()
    server = measurement.server
    stats = measurement.stats
    rps = summary.requests / summary.seconds if summary.seconds else 0.0
    collect = MODES[mode].collect if mode in MODES else 1
    in_flight = max(1, measurement.load.concurrency // collect) if measurement.load.kind == "closed" else None
    seconds = server.seconds if server and server.seconds else 1.0
    p50, p90, p99 = latency_figures(measurement)
    padded_share, padded_compute = padding(measurement) or (float("nan"), float("nan"))
    return Row(
        mode=mode, load=measurement.load.name, throughput=summary.throughput, requests_per_s=rps,
        p50_ms=p50, p90_ms=p90, p99_ms=p99, mean_batch=stats.mean_batch,
        sent=measurement.attempts, failed=sum(not r.ok for r in measurement.records),
        stable=measurement.stable, queue_ms=stats.queue_ms_per_request,
        compute_ms=stats.compute_ms_per_request,
        server_cpu_per_1000=server.server_cpu_s_per_1000 if server else 0.0,
        server_cores=server.server_cpu_s / seconds if server else 0.0,
        client_cores=server.client_cpu_s / seconds if server else 0.0,
        client_bound=rps >= CLIENT_BOUND * ceiling_rps(result, in_flight), ratios={},
        send_lag_p99_ms=send_lag_p99_ms(measurement),
        outside_server_ms=outside_server_ms(
            summary.mean_ms, stats.queue_ms_per_request, stats.compute_ms_per_request
        ) if collect == 1 and server else Unmeasured(
            "a static batch waits in the client for its arrivals" if server else "no server statistics"
        ),
        padded_share=padded_share, padded_compute=padded_compute,
    )  # fmt: skip


def latency_figures(measurement: Measurement) -> tuple[float, float, float]:
    """p50, p90, p99; ``Unmeasured`` where no request was answered in the measured windows."""
    summary = measurement.summary()
    if summary.succeeded:
        return summary.p50_ms, summary.p90_ms, summary.p99_ms
    failed, sent = sum(not r.ok for r in measurement.records), measurement.attempts
    why = Unmeasured(f"no request answered ({failed} of {sent} failed)" if sent else "no request was sent")
    return why, why, why


def outside_server_ms(client_mean_ms: float, queue_ms: float, compute_ms: float) -> float:
    """The client's mean latency not spent in the server's queue or compute; ``Unmeasured`` where
    negative: the two span different times, so that says the spans disagree."""
    outside = client_mean_ms - queue_ms - compute_ms
    if outside >= 0:
        return outside
    return Unmeasured("the server's queue and compute exceed the client's mean (different spans)")


def send_lag_p99_ms(measurement: Measurement) -> float:
    """p99 of (send time − last arrival) in the measured windows: the client's own lateness."""
    lags = [r.send_s - max(r.arrivals) for r in measurement.measured_records() if r.ok and r.arrivals]
    return float(np.percentile(lags, 99) * 1e3) if lags else float("nan")


def with_ratios(rows: list[Row]) -> list[Row]:
    """Each row's QPS and latencies as ratios to the ``none`` row (if present)."""
    base = next((r for r in rows if r.mode == "none"), None)
    if base is None:
        return rows
    of_base = {k: getattr(base, k) for k in ("throughput", "p50_ms", "p90_ms", "p99_ms")}
    return [
        replace(r, ratios={k: getattr(r, k) / b if b else math.nan for k, b in of_base.items()}) for r in rows
    ]


def open_loop_rows(result: StudyResult, family: FamilyResult) -> list[Row]:
    return with_ratios([row(result, mode, m) for mode, m in family.open_loop.items()])


def at_concurrency(family: FamilyResult, mode: str, concurrency: int) -> Measurement | None:
    """The mode's closed-loop run at ``concurrency`` (static: its first batch in flight)."""
    runs = family.sweep.get(mode, [])
    exact = [m for m in runs if m.load.concurrency == concurrency]
    return exact[0] if exact else (runs[0] if runs and MODES[mode].collect > 1 else None)


def closed_loop_rows(result: StudyResult, family: FamilyResult, concurrency: int) -> list[Row]:
    runs = {mode: at_concurrency(family, mode, concurrency) for mode in family.sweep}
    return with_ratios([row(result, mode, m) for mode, m in runs.items() if m is not None])


def padding(measurement: Measurement) -> tuple[float, float] | None:
    """(padded share, positions computed per position needed); None for fixed shapes."""
    sized = [r for r in measurement.measured_records() if r.ok and r.sent_length]
    sent = sum(r.batch * r.sent_length for r in sized)
    needed = sum(r.batch * r.length for r in sized)
    return (1 - needed / sent, sent / needed) if sent and needed else None


def served_batches(family: FamilyResult) -> dict[int, BatchBucket]:
    """Executions and compute per formed batch size over the single-instance modes' windows."""
    every = [*family.sweep.items(), *((m, [x]) for m, x in family.open_loop.items())]
    stats = [
        run.server.stats for mode, runs in every if MODES[mode].instances == 1 for run in runs if run.server
    ]
    return sum(stats, ModelStats()).batches


def fit_served(family: FamilyResult) -> LatencyFit | None:
    """The latency model fitted to the server's compute per batch size (sizes seen often enough)."""
    buckets = {s: b for s, b in served_batches(family).items() if b.executions >= MIN_EXECUTIONS}
    points = {size: b.compute_ns / b.executions / 1e6 for size, b in buckets.items()}
    # Weighted by executions: a size seen 2,000 times is a far better estimate than one seen 5 times.
    weights = {size: float(b.executions) for size, b in buckets.items()}
    return fit_latency(points, weights) if len(points) >= 2 else None


def fit_raw(raw: list[RawPoint]) -> LatencyFit | None:
    return fit_latency({p.batch: p.batch_ms for p in raw}) if len(raw) >= 2 else None


def raw_at(raw: Sequence[RawPoint], batch: float, figure: str) -> float:
    """Raw onnxruntime's ``figure`` (a ``RawPoint`` field) at ``batch``, interpolated."""
    return float(np.interp(batch, [p.batch for p in raw], [getattr(p, figure) for p in raw]))


def formed_histogram(measurement: Measurement) -> dict[int, int]:
    return {size: bucket.executions for size, bucket in sorted(measurement.stats.batches.items())}


@dataclass(frozen=True)
class GainCheck:
    mode: str
    measured: float  # throughput(mode) / throughput(none), same concurrency
    predicted: float  # from the fit and the batch sizes the mode really formed

    @property
    def error_pct(self) -> float:
        return error_percent(self.predicted, self.measured)


def predicted_throughput(fit: LatencyFit, mode: str, concurrency: int, formed: dict[int, int]) -> float:
    """One instance under a closed loop below the maximum batch: a delay that outlasts a batch's compute
    is waited out with every request in flight; else batches run back to back at the sizes formed."""
    delay = MODES[mode].max_queue_delay_ms or 0.0
    if delay >= fit.batch_ms(concurrency):
        return 1000 * concurrency / (delay + fit.batch_ms(concurrency))
    return fit.throughput_for(formed)


def gain_checks(family: FamilyResult, fit: LatencyFit, concurrency: int) -> list[GainCheck]:
    none = at_concurrency(family, "none", concurrency)
    base = none.summary().throughput if none is not None else 0.0
    checks = []
    for mode in family.sweep if base else ():
        measurement = at_concurrency(family, mode, concurrency)
        histogram = formed_histogram(measurement) if measurement else {}
        if MODES[mode].max_queue_delay_ms is not None and MODES[mode].instances == 1 and histogram:
            predicted = predicted_throughput(fit, mode, concurrency, histogram) / fit.throughput(1)
            checks.append(GainCheck(mode, measurement.summary().throughput / base, predicted))
    return checks


@dataclass(frozen=True)
class Efficiency:
    """Served vs raw at the batch size the server ran: end to end, compute only, and CPU cost."""

    mode: str
    mean_batch: float
    served: float  # samples/s, client view
    raw: float  # raw onnxruntime samples/s at mean_batch (interpolated)
    compute_ratio: float  # raw batch time / server compute time, at the formed batch sizes
    server_cpu_per_1000: float
    raw_cpu_per_1000: float
    overhead: Overhead  # serving's cost per execution over raw, at the formed batches

    @property
    def ratio(self) -> float:
        return self.served / self.raw if self.raw else float("nan")


def efficiencies(family: FamilyResult, concurrency: int) -> list[Efficiency]:
    raw = family.raw
    if not raw:
        return []
    raw_fit = fit_raw(raw)
    out = []
    for mode in family.sweep:
        measurement = at_concurrency(family, mode, concurrency)
        if MODES[mode].collect > 1 and family.sweep[mode]:  # a fixed batch: its best run, any concurrency
            measurement = max(family.sweep[mode], key=lambda m: m.summary().throughput)
        if measurement is None or measurement.server is None:
            continue
        stats = measurement.server.stats
        batch = stats.mean_batch or 1.0
        out.append(Efficiency(
            mode, batch, measurement.summary().throughput, raw_at(raw, batch, "throughput"),
            compute_ratio(raw_fit, stats), measurement.server.server_cpu_s_per_1000,
            raw_at(raw, batch, "cpu_s_per_1000"), overhead_of(stats.batches, raw),
        ))  # fmt: skip
    return out


def compute_ratio(raw_fit: LatencyFit | None, stats: ModelStats) -> float:
    """Raw onnxruntime's time for the batches the server ran over the server's compute for them."""
    served_busy = sum(b.compute_ns / 1e6 for b in stats.batches.values())
    if not served_busy:
        return Unmeasured("the server reported no compute time in these windows")
    if raw_fit is None or raw_fit.flaw:
        return Unmeasured(f"raw onnxruntime: {raw_fit.flaw if raw_fit else 'fewer than two batch sizes'}")
    raw_busy = sum(raw_fit.batch_ms(size) * b.executions for size, b in stats.batches.items())
    return raw_busy / served_busy


@dataclass(frozen=True)
class Overhead:
    """Serving's cost per execution over raw onnxruntime, over the executions of some batch sizes."""

    batch: float  # mean batch size of the executions it holds for
    executions: int
    served_ms: float  # the server's compute per execution
    raw_ms: float  # raw onnxruntime per execution at the same batch sizes; NaN where unknown
    why: str = ""  # why the overhead cannot be measured ("": it can)

    @property
    def ms(self) -> float:
        return self.served_ms - self.raw_ms

    @property
    def ratio(self) -> float:
        return self.served_ms / self.raw_ms if self.raw_ms > 0 else math.nan


def raw_ms_at(raw: Sequence[RawPoint], size: int) -> float | None:
    """Raw onnxruntime ms at ``size`` rows, linear between measured sizes; None outside them."""
    if not raw or not min(p.batch for p in raw) <= size <= max(p.batch for p in raw):
        return None
    return raw_at(sorted(raw, key=lambda p: p.batch), size, "batch_ms")


def overhead_of(batches: Mapping[int, BatchBucket], raw: Sequence[RawPoint]) -> Overhead:
    """The overhead per execution over every execution in ``batches`` (formed size → bucket)."""
    executions = sum(b.executions for b in batches.values())
    if executions <= 0:
        return Overhead(
            math.nan, 0, math.nan, math.nan, "the server ran no execution in the measured windows"
        )
    batch = sum(size * b.executions for size, b in batches.items()) / executions
    served_ms = sum(b.compute_ns for b in batches.values()) / 1e6 / executions
    at = {size: raw_ms_at(raw, size) for size in batches}
    outside = [size for size, ms in at.items() if ms is None]
    raw_ms = math.nan if outside else sum(at[size] * b.executions for size, b in batches.items()) / executions
    why = ""
    if not raw:
        why = "raw onnxruntime was not timed"
    elif outside:
        sizes = sorted(p.batch for p in raw)
        why = f"batch {outside[0]} is outside the raw batch sizes ({sizes[0]}–{sizes[-1]})"
    elif not math.isfinite(raw_ms):
        why = "raw onnxruntime's time is not a number"
    elif served_ms < raw_ms:
        why = (
            f"served compute {number(served_ms, 3)} ms is below raw onnxruntime's {number(raw_ms, 3)} ms: "
            "the two were timed at different moments on shared cores"
        )
    return Overhead(batch, executions, served_ms, raw_ms, why)


def overhead_cell(overhead: Overhead | None) -> str:
    """The overhead in ms for a table, or "could not be measured (why)"."""
    if overhead is None:
        return f"{markdown.UNMEASURED} (no server statistics)"
    return f"{markdown.UNMEASURED} ({overhead.why})" if overhead.why else number(overhead.ms, 3)


def at_raw_sizes(batches: Mapping[int, BatchBucket], raw: Sequence[RawPoint]) -> list[Overhead]:
    """One overhead per raw batch size the server formed at least ``MIN_EXECUTIONS`` times."""
    return [
        overhead_of({point.batch: batches[point.batch]}, raw)
        for point in sorted(raw, key=lambda p: p.batch)
        if point.batch in batches and batches[point.batch].executions >= MIN_EXECUTIONS
    ]


GOAL_FAMILY = "recommender"
OVERHEAD_NOTE = (
    "the model counts compute only; per-request serving overhead (client, gRPC, Python-backend IPC) and "
    "the batcher's waiting are paid whatever the batch, so they shrink the measured gain"
)


# Where a missed goal's explanation starts pointing at a limit (diagnoses, not goals).
CORES_BUSY = 0.85  # server + client CPU at this share of the machine's cores: the cores limit
SLOW_BACKEND = 0.9  # raw / server compute time below this: the Python backend's execution limits
LATE_MS = 1.0  # client lateness or time outside the server above this many ms is worth naming


def limits_of(row: Row, efficiency: Efficiency | None = None) -> str:
    notes = []
    if row.client_bound:
        notes.append(
            f"client-bound ({row.requests_per_s:.0f} req/s is within {CLIENT_BOUND:.0%} of the "
            "harness ceiling)"
        )
    cores = row.server_cores + row.client_cores
    if cores >= CORES_BUSY * CORES:
        notes.append(f"cores: server {row.server_cores:.2f} + client {row.client_cores:.2f} of {CORES} busy")
    measured = efficiency is not None and why_unmeasured(efficiency.compute_ratio) is None
    if measured and 0 < efficiency.compute_ratio < SLOW_BACKEND:
        notes.append(
            f"Python-backend execution: server compute is {ratio(1 / efficiency.compute_ratio)} raw "
            f"onnxruntime's at the same batch sizes (IPC, concatenation, thread contention)"
        )
    if row.send_lag_p99_ms > LATE_MS:
        notes.append(f"client lateness: p99 {row.send_lag_p99_ms:.1f} ms from arrival to send")
    if row.outside_server_ms > LATE_MS:
        notes.append(
            f"outside the server: {row.outside_server_ms:.1f} ms of the mean latency is neither queue nor "
            "compute (client, gRPC, response path)"
        )
    if row.queue_ms > row.compute_ms:
        notes.append(f"queueing: {row.queue_ms:.1f} ms queue vs {row.compute_ms:.1f} ms compute per request")
    return "; ".join(notes) or "no single limit stands out"


def dynamic_vs_none(result: StudyResult, family: FamilyResult) -> Goal:
    concurrency = result.profile.goal_concurrency
    qps, p99 = GOALS["dynamic QPS"], GOALS["dynamic p99"]
    rows = closed_loop_rows(result, family, concurrency)
    dynamic = [r for r in rows if MODES[r.mode].max_queue_delay_ms is not None and r.ratios]
    target = f"{qps.target()}, {p99.target()} (concurrency {concurrency})"
    if not dynamic:
        return Goal("dynamic vs none", target, "not measured", None)
    best = max(dynamic, key=lambda r: (bool(p99.met(r.ratios["p99_ms"])), r.ratios["throughput"]))
    text = ", ".join(
        f"{r.mode}: {ratio(r.ratios['throughput'])} QPS, p99 {ratio(r.ratios['p99_ms'])}" for r in dynamic
    )
    met = all_met([qps.met(best.ratios["throughput"]), p99.met(best.ratios["p99_ms"])])
    if met is not False:  # met, or nothing to compare with (none answered nothing)
        return Goal("dynamic vs none", target, text, met)
    effs = {e.mode: e for e in efficiencies(family, concurrency)}
    limits = f"best {best.mode} is {qps.share(best.ratios['throughput']):.0%} of the target; "
    return Goal("dynamic vs none", target, text, met, limits + limits_of(best, effs.get(best.mode)))


def served_vs_raw(result: StudyResult, family: FamilyResult) -> Goal:
    goal, concurrency = GOALS["served vs raw"], result.profile.goal_concurrency
    effs = [e for e in efficiencies(family, concurrency) if MODES[e.mode].instances == 1]
    if not effs:
        return goal.outcome()
    text = ", ".join(f"{e.mode} (batch {number(e.mean_batch)}): {ratio(e.ratio)}" for e in effs)
    best = max(effs, key=lambda e: e.ratio)
    met = goal.met(best.ratio)
    limits = ""
    if not met:
        rows = {r.mode: r for r in closed_loop_rows(result, family, concurrency)}
        limits = (
            f"best {best.mode} reaches {goal.share(best.ratio):.0%} of the target; "
            f"{limits_of(rows[best.mode], best)}; CPU per 1,000 inferences: server "
            f"{best.server_cpu_per_1000:.2f} s vs raw {best.raw_cpu_per_1000:.2f} s"
        )
    short = [e for e in effs if not goal.met(e.ratio)]
    if met and short:
        below = ", ".join(f"{e.mode} {ratio(e.ratio)}" for e in short)
        met_by = ", ".join(e.mode for e in effs if goal.met(e.ratio))
        limits = (
            f"met by {met_by} only; below {goal.limit:g}×: {below}: per-request overhead (client, gRPC, "
            "Python-backend IPC) weighs on small batches, and a batcher that waits out its delay idles"
        )
    return goal.outcome(text, met, limits)


def latency_model(result: StudyResult, family: FamilyResult) -> list[Goal]:
    fit_goal, gain_goal = GOALS["latency-model fit"], GOALS["predicted gain"]
    fit = fit_served(family)
    if fit is None:
        return [fit_goal.outcome("too few batch sizes formed")]
    measured = f"{fit_text(fit)} ({len(fit.points)} sizes)"
    if fit.flaw:  # a fit no batch follows: not a model, however well it matches the points
        return [fit_goal.outcome(measured, False, fit.flaw)]
    met = fit_goal.met(fit.r2)
    scatter = "" if met else "compute times per batch size scatter (shared cores)"
    goals = [fit_goal.outcome(measured, met, scatter)]
    checks = gain_checks(family, fit, result.profile.goal_concurrency)
    if checks:
        text = ", ".join(
            f"{c.mode}: predicted {ratio(c.predicted)} vs measured {ratio(c.measured)} "
            f"({percent(c.error_pct)})"
            for c in checks
        )
        met = all_met(gain_goal.met(abs(c.error_pct)) for c in checks)
        goals.append(gain_goal.outcome(text, met, OVERHEAD_NOTE if met is False else ""))
    return goals


def poisson_bound(result: StudyResult, family: FamilyResult) -> Goal:
    goal = GOALS["Poisson p99 bound"]
    parts, verdicts, limits = [], [], []
    rows = {r.mode: r for r in open_loop_rows(result, family)}
    for mode, measurement in family.open_loop.items():
        delay = MODES[mode].max_queue_delay_ms
        if delay is None or measurement.server is None or not measurement.server.stats.batches:
            continue
        largest = max(measurement.server.stats.batches)
        waited = delay + measurement.server.stats.compute_ms_at(largest)  # the bound without its slack
        bound = waited + goal.limit
        p99 = rows[mode].p99_ms
        ok = goal.met(p99 - waited)  # None: no request answered, so no p99 (the text says why)
        verdicts.append(ok)
        parts.append(f"{mode}: p99 {number(p99, unit=' ms')} vs bound {number(bound, unit=' ms')}")
        if ok is False:
            note = f"{mode} over by {p99 - bound:.1f} ms: " + limits_of(rows[mode])
            if rows[mode].queue_ms > delay:
                note += (
                    f"; queue {rows[mode].queue_ms:.1f} ms/request > the {delay:.0f} ms delay: at this load "
                    "a request often arrives while a batch is running and waits for it too, a second "
                    "compute the bound does not count"
                )
            limits.append(note)
    if not parts:
        return goal.outcome()
    load = family.open_load.name if family.open_load else ""
    return Goal(
        f"{goal.name} ({load})", goal.target(), ", ".join(parts), all_met(verdicts), "; ".join(limits)
    )


RECOMMENDER_ONLY_NOTE = (
    "not applicable: the {limit} target is the recommender's, an overhead-bound model where batching "
    "amortizes per-request cost; {model}'s gain is what its compute per row leaves to share (the latency "
    "model's predicted gain below says what to expect)"
)


def for_model(goal: Goal, model: str) -> Goal:
    """``goal`` named with ``model``; ``dynamic vs none``'s 4× is the recommender's, "n/a" for others
    (a compute-bound model would read MISSED however well it is served)."""
    if model == GOAL_FAMILY or goal.name != "dynamic vs none":
        return replace(goal, model=model)
    note = RECOMMENDER_ONLY_NOTE.format(limit=GOALS["dynamic QPS"].target(), model=model)
    return Goal(goal.name, goal.target, goal.measured, None, note, model)


def all_goals(result: StudyResult) -> list[Goal]:
    """Every model's goals, in the order the models were measured (``MODELS=a,b``)."""
    goals = []
    for model, family in result.families.items():
        judged = [
            dynamic_vs_none(result, family), served_vs_raw(result, family),
            *latency_model(result, family), poisson_bound(result, family),
        ]  # fmt: skip
        goals += [for_model(goal, model) for goal in judged]
    return goals
