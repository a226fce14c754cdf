"""One measurement, whatever sends the load: the ``Measurement`` every study and the tuner read, with
the server's view over exactly the windows that count where the engine runs in this process."""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from client.stats import ModelStats
from perf.measure.engine import (
    P99_SAMPLES,
    EngineFigures,
    EngineRun,
    Job,
    LoadEngine,
    MeasureSettings,
    OurEngine,
)
from perf.measure.loads import Load, arrival_times
from perf.measure.records import Record, Summary, in_span, summarize
from perf.measure.server_view import ServerDelta, ServerEndpoints, ServerSnapshot, delta, snapshot
from perf.measure.target import Target

log = logging.getLogger(__name__)
SUSTAINED = 0.95  # an open loop was kept up with when the server answered this share of its rate


@dataclass
class Measurement:
    label: str
    model: str
    load: Load
    records: list[Record]
    windows: list[tuple[float, float]]
    used: tuple[int, int]  # windows[used[0]:used[1]] are the measurement
    stable: bool
    attempts: int  # requests started plus arrivals shed: must equal len(records)
    server: ServerDelta | None = None  # over the used windows (an engine in another process: the run)
    server_total: ModelStats | None = None  # from before warm-up to after the drain
    engine: str = OurEngine.name
    own: EngineFigures | None = None  # the engine's own figures of the used windows (perf_analyzer's)
    wall_s: float = 0.0  # the whole run, warm-up, reads of the server and drain included
    p99_samples: int = P99_SAMPLES  # the requests its p99 must rest on to be judged (its settings')

    @property
    def span(self) -> tuple[float, float]:
        return self.windows[self.used[0]][0], self.windows[self.used[1] - 1][1]

    @functools.cached_property
    def figures(self) -> Summary:
        """``summary()``, computed once (the records do not change)."""
        return self.summary()

    def summary(self) -> Summary:
        return summarize(self.records, *self.span)

    def measured_records(self) -> list[Record]:
        return in_span(self.records, *self.span)

    def mean_window_rate(self) -> float:
        """The mean of the counted windows' throughputs: perf_analyzer's own figure (its CSV)."""
        first, last = self.used
        return float(np.mean([summarize(self.records, a, b).throughput for a, b in self.windows[first:last]]))

    @property
    def p99_ms(self) -> float:
        return self.figures.p99_ms

    @property
    def throughput(self) -> float:
        return self.figures.throughput

    @functools.cached_property
    def offered(self) -> float:
        """An open loop's arrivals per second over the windows that count, as drawn (a Poisson draw of
        a few seconds is a few % off its mean rate); 0 for a closed loop."""
        if self.load.kind != "open":
            return 0.0
        start, end = self.span
        times = arrival_times(self.load, end)
        return float(np.count_nonzero(times >= start)) / (end - start) if end > start else 0.0

    @property
    def failed(self) -> int:
        """Its requests that failed over the windows that count."""
        return self.figures.failed

    @property
    def sustained(self) -> bool:
        """Nothing failed, and an open loop's rate was kept up with."""
        return bool(self.figures.failed == 0 and self.throughput >= SUSTAINED * self.offered)

    @property
    def samples(self) -> int:
        """The requests (samples) its latency percentiles rest on."""
        return self.figures.samples

    @property
    def too_few(self) -> bool:
        """Its percentiles rest on fewer requests than a p99 is judged on (``p99_samples``)."""
        return self.samples < self.p99_samples

    def meets(self, budget_ms: float) -> bool:
        """The one judgement of "within the budget": kept up with, enough requests, p99 within it."""
        return self.sustained and not self.too_few and self.p99_ms <= budget_ms

    @property
    def stats(self) -> ModelStats:
        """The server's statistics over the measurement (empty without a server view)."""
        return self.server.stats if self.server else ModelStats()

    @property
    def stolen_share(self) -> float:
        """The share of the CPUs' time the hypervisor took (NaN without a reading)."""
        return self.server.stolen_share if self.server else math.nan


def too_few_text(samples: int) -> str:
    """How reports name a run whose p99 rests on too few requests (``too_few``)."""
    return f"too few requests: {samples}"


def too_few_note(samples: int, too_few: bool) -> str:
    """`` (too few requests: N)`` after a run's p99 where it was too few."""
    return f" ({too_few_text(samples)})" if too_few else ""


def measure(
    target: Target,
    load: Load,
    settings: MeasureSettings | None = None,
    endpoints: ServerEndpoints | None = None,
    label: str = "",
    related: tuple[str, ...] = (),
    engine: LoadEngine | None = None,
) -> Measurement:
    """Measure ``target`` under ``load`` with ``engine`` (ours by default); ``endpoints`` adds the
    server's view, of the ``related`` models (an ensemble's steps) too."""
    engine = engine or OurEngine()
    settings = settings or MeasureSettings()
    started = time.perf_counter()
    take = (lambda: snapshot(endpoints, target.model, time.perf_counter(), related)) if endpoints else None
    before = take() if take else None
    edges: list[ServerSnapshot] = []
    at_edge = (lambda _at: edges.append(take())) if take else None
    job = Job(target, load, settings, label)
    run = engine.run(job, at_edge)
    measurement = _measurement(job, run, engine.name)
    if take and before:
        after = _settled(take)
        measurement.server = delta(edges[run.used[0] : run.used[1] + 1] if edges else [before, after])
        measurement.server_total = after.stats - before.stats
    measurement.wall_s = time.perf_counter() - started
    if not run.stable:
        log.info("%s: windows did not agree; counting the last %d", label, run.used[1] - run.used[0])
    return measurement


async def measure_async(
    target: Target, load: Load, settings: MeasureSettings, label: str = ""
) -> Measurement:
    """``measure`` with our engine inside a running event loop (two loads at once); no server view."""
    started = time.perf_counter()
    job = Job(target, load, settings, label)
    measurement = _measurement(job, await OurEngine().run_async(job), OurEngine.name)
    measurement.wall_s = time.perf_counter() - started
    return measurement


def _measurement(job: Job, run: EngineRun, engine: str) -> Measurement:
    needed = job.settings.p99_samples
    return Measurement(job.label, job.target.model, job.load, engine=engine, p99_samples=needed, **vars(run))


def _settled(take: Callable[[], ServerSnapshot]) -> ServerSnapshot:
    """A snapshot once the counts settle: Triton counts a request just after sending its response."""
    last = take()
    for _ in range(40):
        time.sleep(0.05)
        again = take()
        if again.stats.requests == last.stats.requests and again.stats.failed == last.stats.failed:
            return again
        last = again
    return last
