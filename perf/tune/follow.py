"""Follow the arrival pattern: watch the arrival rate on the metrics endpoint and, when it shifts,
reload the model with the delay the batcher simulation prefers for the new rate.

``Follower`` reads ``nv_inference_request_success`` + ``nv_inference_request_failure`` of the model
every ``interval_s`` (the counters Triton updates per request), turns them into a rate over the last
``window_s``, and reloads (explicit model control, ``load_model`` with a config override) when the
rate has moved more than ``hysteresis`` from the rate the current configuration was chosen for and
the policy picks a different configuration. Reloads keep serving: Triton loads the new configuration
beside the old one and swaps when it is ready, so requests in flight finish on the old one. The demo
counts every failed request across reloads (there must be none).
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from perf.loads import poisson
from perf.records import Record, latencies
from perf.server_view import parse_metrics
from perf.tune.batcher_sim import BatcherConfig, ServiceModel
from perf.tune.predict import arrival_array, predict
from perf.tune.session import Observed, TuneSession

log = logging.getLogger(__name__)
COUNTERS = ("nv_inference_request_success", "nv_inference_request_failure")
Policy = Callable[[float], BatcherConfig]


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
    table = []
    for rate in ladder:
        configs = [BatcherConfig(max_batch, d, (), instances) for d in sorted(delays_us)]
        scored = [(predict(c, service, poisson(rate), seconds=3.0), c) for c in configs]
        fitting = [c for p, c in scored if p.sustained and p.p99_ms <= margin * budget_ms]
        table.append(fitting[-1] if fitting else min(scored, key=lambda pc: pc[0].p99_ms)[1])

    def policy(rate: float) -> BatcherConfig:
        index = max(0, int(np.searchsorted(ladder, rate, side="right")) - 1)
        return table[index]

    policy.table = list(zip(ladder, table, strict=True))  # type: ignore[attr-defined]
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
    session: TuneSession
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
        parts.append(arrival_array(poisson(rate, seed + index), seconds) + offset)
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
    observed: Observed
    reloads: list[Reload]
    rates: list[tuple[float, float]]

    @property
    def server_failed(self) -> int:
        return self.observed.stats.failed


def follow_run(
    session: TuneSession, arrivals: np.ndarray, start: BatcherConfig, policy: Policy | None, label: str
) -> FollowRun:
    """Replay ``arrivals`` from ``start``; with a ``policy``, a ``Follower`` reloads as the rate moves.
    Reload and rate times come back on the records' clock (seconds from the first arrival)."""
    session.load(start)
    follower = Follower(session, policy) if policy else None
    if follower:
        follower.start()
    try:
        observed = session.open_loop(arrivals, label, wait_s=0)  # one trace, the reloads in it: not replayed
    finally:
        if follower:
            follower.stop.set()
            follower.join(timeout=30)
    t0 = session.engine.last_start
    reloads = [Reload(r.at_s - t0, r.rate, r.config, r.seconds) for r in follower.reloads] if follower else []
    rates = [(t - t0, rate) for t, rate in follower.rates] if follower else []
    return FollowRun(label, observed, reloads, rates)
