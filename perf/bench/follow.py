"""``python -m perf tune --follow``: follow the arrival rate, reloading the model with the delay the
batcher simulation prefers for it; a rate step replayed with a fixed configuration and with one that
follows.

``Follower`` reads ``nv_inference_request_success`` + ``nv_inference_request_failure`` of the model
every ``interval_s`` (the counters Triton updates per request), turns them into a rate over the last
``window_s``, and reloads (explicit model control, ``load_model`` with a config override) when the rate
has moved more than ``hysteresis`` from the rate the current configuration was chosen for and the
policy picks a different configuration. Reloads keep serving: Triton loads the new configuration beside
the old one and swaps when it is ready, so requests in flight finish on the old one.

Both runs replay the same arrivals (low rate, high rate, low rate) from the same start, the
configuration the policy picks for the peak; the report shows p99 per second for both, every reload,
and the failed requests of each run (the client's count and the server's), which must be zero. A
replay has its reloads in it: it is run once, with our client (perf_analyzer aborts after a reload),
never measured again.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from exporters.resolve import load_spec
from perf.errors import OptionError
from perf.markdown import number, table, write_report
from perf.measure.engine import MeasureSettings, OurEngine
from perf.measure.loads import Load, arrival_times, poisson
from perf.measure.measurement import Measurement, measure
from perf.measure.records import Record, latencies, write_csv
from perf.measure.server_view import parse_metrics
from perf.model.batcher import BatcherConfig, ServiceModel
from perf.model.grid import MAX_BATCH
from perf.model.predict import predict
from perf.session.model import ModelSession
from perf.session.probe import ProbePlan, probe
from perf.studies.plots import save_figure
from perf.tune.report import p99_plot

log = logging.getLogger(__name__)
COUNTERS = ("nv_inference_request_success", "nv_inference_request_failure")
DELAYS_US = (0, 500, 1000, 2000, 5000, 10000)
Policy = Callable[[float], BatcherConfig]


@dataclass(frozen=True)
class FollowOptions:
    """What ``--follow`` runs with, checked before any server starts or report folder is made
    (``perf.bench.cli`` builds it from the command line). ``seconds``: each phase of the rate step
    (low, high, low again)."""

    seconds: float
    spec: Path = Path("models.yaml")
    model: str = "recommender"
    p99_ms: float = 10.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.seconds <= 0:
            raise OptionError(f"--seconds must be > 0, got {self.seconds}")
        if not self.model:
            raise OptionError("--model must name a model of the spec, got ''")
        if self.p99_ms <= 0:
            raise OptionError(f"--p99-ms must be > 0, got {self.p99_ms}")
        if self.seed < 0:  # numpy's generators take no negative seed
            raise OptionError(f"--seed must be >= 0, got {self.seed}")


def delay_policy(
    service: ServiceModel,
    max_batch: int,
    instances: int,
    delays_us: tuple[int, ...],
    rates: tuple[float, ...],
    budget_ms: float,
    margin: float = 0.8,
) -> Policy:
    """For each rate of ``rates`` (a ladder): the longest delay whose predicted p99 stays within
    ``margin`` × the budget; the article's "batch size adapted to the arrival pattern". Longer waits
    form fuller batches (fewer executions, less CPU per inference) as long as the tail allows them; near
    capacity, where waiting would break the budget, the delay shrinks. If no delay fits, the one with
    the lowest predicted p99. A rate between rungs takes the rung at or below it."""
    ladder = sorted(rates)
    chosen = []
    for rate in ladder:
        configs = [BatcherConfig(max_batch, d, (), instances) for d in sorted(delays_us)]
        scored = [(predict(c, service, poisson(rate), seconds=3.0), c) for c in configs]
        fitting = [c for p, c in scored if p.sustained and p.p99_ms <= margin * budget_ms]
        chosen.append(fitting[-1] if fitting else min(scored, key=lambda pc: pc[0].p99_ms)[1])

    def policy(rate: float) -> BatcherConfig:
        index = max(0, int(np.searchsorted(ladder, rate, side="right")) - 1)
        return chosen[index]

    policy.table = list(zip(ladder, chosen, strict=True))  # type: ignore[attr-defined]
    return policy


def arrival_count(metrics_url: str, model: str) -> float:
    with urllib.request.urlopen(metrics_url, timeout=5) as response:
        values = parse_metrics(response.read().decode(), model)
    return sum(values.get(name, 0.0) for name in COUNTERS)


@dataclass
class Reload:
    at_s: float
    rate: float
    config: str
    seconds: float


@dataclass(eq=False)  # a Thread must stay hashable
class Follower(threading.Thread):
    session: ModelSession
    policy: Policy
    interval_s: float = 0.25
    window_s: float = 1.0
    hysteresis: float = 0.3
    reloads: list[Reload] = field(default_factory=list)
    rates: list[tuple[float, float]] = field(default_factory=list)  # (perf_counter, observed rate)

    def __post_init__(self) -> None:
        threading.Thread.__init__(self, name="follower", daemon=True)
        self.stop = threading.Event()
        self.chosen_for: float | None = None

    def run(self) -> None:
        assert self.session.server is not None
        url, model = self.session.server.metrics_url, self.session.base.name
        samples: list[tuple[float, float]] = []
        while not self.stop.wait(self.interval_s):
            now = time.perf_counter()
            samples.append((now, arrival_count(url, model)))
            while len(samples) > 2 and samples[1][0] <= now - self.window_s:
                samples.pop(0)
            if len(samples) < 2 or samples[-1][0] - samples[0][0] < 0.5 * self.window_s:
                continue
            rate = (samples[-1][1] - samples[0][1]) / (samples[-1][0] - samples[0][0])
            self.rates.append((now, rate))
            if self.chosen_for and abs(rate - self.chosen_for) <= self.hysteresis * self.chosen_for:
                continue
            config = self.policy(rate)
            self.chosen_for = max(rate, 1.0)
            if config != self.session.current:
                took = self.session.load(config)
                self.reloads.append(Reload(now, rate, config.label, took))
                log.info("follow: %.0f/s -> %s (%.1f s)", rate, config.label, took)


def step_arrivals(phases: list[tuple[float, float]], seed: int = 0) -> np.ndarray:
    """Poisson arrivals in phases of ``(rate, seconds)``: a trace with rate steps."""
    parts, offset = [], 0.0
    for index, (rate, seconds) in enumerate(phases):
        parts.append(arrival_times(poisson(rate, seed + index), seconds) + offset)
        offset += seconds
    return np.concatenate(parts)


def p99_over_time(records: list[Record], bin_s: float = 1.0) -> list[tuple[float, float, int]]:
    """(bin start, p99 ms, failed) per ``bin_s`` of arrival time."""
    if not records:
        return []
    end = max(r.arrivals[0] for r in records)
    out = []
    for start in np.arange(0.0, end + bin_s, bin_s):
        chosen = [r for r in records if start <= r.arrivals[0] < start + bin_s]
        values = latencies(chosen)
        if len(chosen):
            p99 = float(np.percentile(values, 99) * 1e3) if values.size else float("nan")
            out.append((float(start), p99, sum(1 for r in chosen if not r.ok)))
    return out


@dataclass
class FollowRun:
    label: str
    observed: Measurement
    reloads: list[Reload]
    rates: list[tuple[float, float]]

    @property
    def failed(self) -> int:
        return sum(not r.ok for r in self.observed.records)

    @property
    def server_failed(self) -> int:
        return self.observed.stats.failed


def replay(session: ModelSession, arrivals: np.ndarray, label: str) -> Measurement:
    """``arrivals`` sent once, whole, in one window, with our client; the server's view over it."""
    times = arrivals.tolist()
    load = Load("open", label, rate=len(times) / times[-1], arrivals=lambda: iter(times))
    settings = MeasureSettings(warmup_s=0.0, window_s=times[-1] + 0.5, stable_windows=1, max_windows=1)
    return measure(session.target, load, settings, session.endpoints, label, engine=OurEngine())


def follow_run(
    session: ModelSession, arrivals: np.ndarray, start: BatcherConfig, policy: Policy | None, label: str
) -> FollowRun:
    """Replay ``arrivals`` from ``start``; with a ``policy``, a ``Follower`` reloads as the rate moves.
    Reload and rate times come back on the records' clock (seconds from the replay's start)."""
    session.load(start)
    follower = Follower(session, policy) if policy else None
    if follower:
        follower.start()
    try:
        observed = replay(session, arrivals, label)
    finally:
        if follower:
            follower.stop.set()
            follower.join(timeout=30)
    t0 = observed.started_at
    reloads = [Reload(r.at_s - t0, r.rate, r.config, r.seconds) for r in follower.reloads] if follower else []
    rates = [(t - t0, rate) for t, rate in follower.rates] if follower else []
    return FollowRun(label, observed, reloads, rates)


def plot_follow(runs: list[FollowRun], budget_ms: float, path: Path) -> Path:
    figure, axes = plt.subplots(figsize=(7.5, 4.2))
    for index, run in enumerate(runs):
        series = p99_over_time(run.observed.records)
        axes.plot([s[0] for s in series], [s[1] for s in series], "o-", color=f"C{index}", label=run.label)
        for reload in run.reloads:
            axes.axvline(reload.at_s, color=f"C{index}", alpha=0.4, linestyle=":")
    p99_plot(
        axes,
        budget_ms,
        "arrival time (s)",
        "rate step: fixed configuration vs following the rate (dotted: reloads)",
    )
    return save_figure(figure, path, axes, grid="both")


def run_follow(options: FollowOptions, folder: Path, console) -> int:
    model, budget = options.model, options.p99_ms
    console.print(f"--follow on {model}: rate step, fixed vs following → {folder}")
    with ModelSession(load_spec(options.spec), model, MAX_BATCH, Path(".run/tune"), OurEngine()) as session:
        console.print("  probing the service model")
        measured = probe(session, (1,), MAX_BATCH, ProbePlan(max_runs=6))
        capacity = measured.capacity
        # Well inside capacity: the probe's capacity is an upper bound on a machine shared with other work,
        # and an overloaded run sheds requests whatever the configuration.
        low, high = 0.1 * capacity, 0.4 * capacity
        ladder = tuple(capacity * f for f in (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6))
        delays = tuple(d for d in DELAYS_US if d / 1000 < budget)
        policy = delay_policy(measured.services[1], MAX_BATCH, 1, delays, ladder, budget)
        phases = [(low, options.seconds), (high, options.seconds), (low, options.seconds)]
        arrivals = step_arrivals(phases, options.seed)
        peak = policy(high)
        console.print(f"  fixed at {peak.label} (the peak's pick), then following")
        runs = [
            follow_run(session, arrivals, peak, None, f"fixed: {peak.label}"),
            follow_run(session, arrivals, peak, policy, "following the rate"),
        ]
    report = write_follow(runs, phases, policy, model, budget, folder)
    console.print(report.read_text(), highlight=False, markup=False)
    following = runs[1]  # the contract: reloading loses nothing
    return 0 if following.failed == 0 and following.server_failed == 0 else 1


def write_follow(
    runs: list[FollowRun],
    phases: list[tuple[float, float]],
    policy: Policy,
    model: str,
    budget: float,
    folder: Path,
) -> Path:
    plot = plot_follow(runs, budget, folder / "follow.png")
    rows = []
    for run in runs:
        series = p99_over_time(run.observed.records)
        worst, start = [], 0.0
        for _, seconds in phases:
            values = [p for t, p, _ in series if start <= t < start + seconds]
            worst.append(number(max(values)) if values else "–")
            start += seconds
        rows.append(
            [
                run.label,
                *worst,
                number(run.observed.p99_ms),
                f"{run.failed}/{len(run.observed.records)}",
                run.server_failed,
                len(run.reloads),
                number(run.observed.stats.mean_batch),
            ]
        )
    reloads = [
        [number(r.at_s, 1), number(r.rate, 0), r.config, number(r.seconds, 2)] for r in runs[1].reloads
    ]
    (low, seconds), (high, _), _ = phases
    lines = [
        f"# --follow: {model}, p99 budget {budget:g} ms",
        "",
        f"Arrivals: Poisson {number(low, 0)}/s for {seconds:g} s, {number(high, 0)}/s, then "
        f"{number(low, 0)}/s again (the same times in both runs); engine: ours.",
        "",
        "Policy (rate → the longest delay predicted to keep p99 within 80% of the budget): "
        + "; ".join(f"{number(rate, 0)}/s: {config.label}" for rate, config in policy.table),  # type: ignore[attr-defined]
        "",
        f"![p99 over time]({plot.name})",
        "",
        table(
            [
                "run",
                "worst p99/s low",
                "worst p99/s high",
                "worst p99/s low again",
                "p99 overall",
                "failed/sent (client)",
                "failed (server)",
                "reloads",
                "mean formed batch",
            ],
            rows,
        ),
        "",
        "Reloads of the following run:",
        "",
        table(["at (s)", "observed rate /s", "loaded", "took (s)"], reloads) if reloads else "none",
    ]
    for run, name in zip(runs, ("fixed", "following"), strict=True):
        write_csv(run.observed.records, folder / f"follow_{name}.csv")
        reasons = Counter(r.status.split(":")[0] for r in run.observed.records if not r.ok)
        if reasons:
            why = ", ".join(f"{reason} ×{count}" for reason, count in reasons.most_common())
            lines += ["", f"{run.label}: failed requests by reason: {why} (`shed`: the server fell behind)."]
    return write_report(folder / "follow.md", lines)
