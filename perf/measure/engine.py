"""Load engines, behind one interface (``LoadEngine``): ``OurEngine`` here, ``PerfAnalyzerEngine`` in
``analyzer``, each handing back a ``Measurement``; windows and their stability rule are perf_analyzer's
(docs/PERF.md, "One measurement, two engines")."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from client.stats import ModelStats
from perf.errors import OptionError, check_at_least
from perf.measure.loads import Load, arrival_times
from perf.measure.records import Record, Summary, in_span, summarize, window_is_stable
from perf.measure.server_view import ServerDelta
from perf.measure.target import Caller, Target

log = logging.getLogger(__name__)
Edge = Callable[[float], None]  # called with the time (s on the records' clock) of a window edge
# The requests a p99 is judged on, at least: the p99 of fewer is a figure one request decides, not a
# tail. A run with fewer is no evidence of meeting a budget (``Measurement.meets``).
P99_SAMPLES = 100
# The longest the windows a run keeps may last together (sizes every rate from 1.6/s up); a slower
# rate's run has too few requests, reported as such, never as meeting the budget.
KEPT_CAP_S = 90.0
SUSTAINED = 0.95  # an open loop was kept up with when the server answered this share of its rate


@dataclass(frozen=True)
class MeasureSettings:
    """Like perf_analyzer: ``stable_windows`` consecutive windows within ``tolerance``, at most
    ``max_windows``, after ``warmup_s``. A session (``perf.session.model``) also reads the last two."""

    warmup_s: float = 1.0
    window_s: float = 2.0
    stable_windows: int = 3
    max_windows: int = 6
    tolerance: float = 0.10
    window_batches: int = 20  # windows last this many of the largest batch: a few say little of a p99
    remeasure_stolen: bool = True
    p99_samples: int = P99_SAMPLES  # tests lower it to keep short windows: the rule still sizes them

    def __post_init__(self) -> None:
        if not self.window_s > 0:
            raise OptionError(f"window_s (--window) must be > 0 seconds, got {self.window_s}")
        check_at_least((
            ("stable_windows", self.stable_windows, 1), ("window_batches", self.window_batches, 1),
            ("p99_samples", self.p99_samples, 1),
        ))  # fmt: skip
        if self.max_windows < self.stable_windows:
            raise OptionError(
                f"max_windows (--max-windows) must be >= stable_windows ({self.stable_windows}), "
                f"got {self.max_windows}"
            )
        if not self.tolerance > 0:
            raise OptionError(f"tolerance must be > 0, got {self.tolerance}")

    @property
    def longest_s(self) -> float:
        return self.warmup_s + self.max_windows * self.window_s

    def agree(self, figures: list[tuple[float, float]]) -> bool:
        """Whether the last ``stable_windows`` (throughput, mean latency) pairs agree."""
        recent = figures[-self.stable_windows :]
        return len(recent) == self.stable_windows and all(
            window_is_stable([f[i] for f in recent], self.tolerance) for i in (0, 1)
        )


def sized_for(settings: MeasureSettings, load: Load, kept: int, label: str = "") -> MeasureSettings:
    """``settings`` with an open loop's windows long enough that the ``kept`` that count expect
    ``p99_samples`` arrivals and four Poisson spreads more (short once in 3,000 runs), at most
    ``KEPT_CAP_S`` together."""
    if load.kind == "closed" or load.rate <= 0:
        return settings
    wanted = settings.p99_samples + 4 * math.sqrt(settings.p99_samples)
    kept_s = min(wanted / load.rate, KEPT_CAP_S)
    if kept_s <= kept * settings.window_s:
        return settings
    capped = f", capped at {KEPT_CAP_S:g} s: fewer than a p99 needs" if kept_s < wanted / load.rate else ""
    log.info("%s: windows of %.1f s, not %.1f s: the %d that count expect %.0f requests at %.3g/s (a p99 "
             "rests on %d or more%s)", label or load.name, kept_s / kept, settings.window_s, kept,
             kept_s * load.rate, load.rate, settings.p99_samples, capped)  # fmt: skip
    return dataclasses.replace(settings, window_s=kept_s / kept)


@dataclass(frozen=True)
class EngineFigures:
    """An engine's own figures of the windows that count (perf_analyzer's CSV), to hold ours against."""

    throughput: float
    p50_ms: float
    p99_ms: float
    settings: tuple[str, ...] = ()  # the measurement options it ran with (reports print them)


@dataclass(frozen=True)
class Job:
    """What an engine is asked to run: ``load`` against ``target`` in ``settings``' windows."""

    target: Target
    load: Load
    settings: MeasureSettings
    label: str = ""

    def measurement(
        self, engine: str, records: list[Record], windows: list[tuple[float, float]], used: tuple[int, int],
        stable: bool, attempts: int, own: EngineFigures | None = None,
    ) -> Measurement:  # fmt: skip
        """What an engine hands back for this job, on one clock (seconds from the run's start)."""
        return Measurement(self.label, self.target.model, self.load, records, windows, used, stable, attempts,
                           engine=engine, own=own, p99_samples=self.settings.p99_samples)  # fmt: skip


@dataclass
class Measurement:
    """One measurement, whatever sent its load: every record (warm-up and drain too) and window on one
    clock, which windows count, and the server's view of them (``measurement.measure`` adds it)."""

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
    engine: str = "ours"  # the load engine that sent it (``LoadEngine.name``)
    own: EngineFigures | None = None  # the engine's own figures of the used windows (perf_analyzer's)
    wall_s: float = 0.0  # the whole run, warm-up, reads of the server and drain included
    p99_samples: int = P99_SAMPLES  # the requests its p99 must rest on to be judged (its settings')

    @property
    def span(self) -> tuple[float, float]:
        return self.windows[self.used[0]][0], self.windows[self.used[1] - 1][1]

    @functools.cached_property
    def figures(self) -> Summary:
        return summarize(self.records, *self.span)

    def summary(self) -> Summary:
        return self.figures

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
        a few seconds is a few % off its mean rate); 0 for a closed loop. Every arrival up to the span's
        end counts: a cap on them would count a fast rate's later windows as offered nothing, and a run
        that fell behind as sustained."""
        if self.load.kind != "open":
            return 0.0
        start, end = self.span
        times = arrival_times(self.load, end, limit=None)
        return float(np.count_nonzero(times >= start)) / (end - start) if end > start else 0.0

    @property
    def failed(self) -> int:
        return self.figures.failed

    @property
    def sustained(self) -> bool:
        """Nothing failed, and an open loop's rate was kept up with."""
        return bool(self.failed == 0 and self.throughput >= SUSTAINED * self.offered)

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
        return self.server.stats if self.server else ModelStats()

    @property
    def stolen_share(self) -> float:
        return self.server.stolen_share if self.server else math.nan


class LoadEngine(Protocol):
    name: str

    def run(self, job: Job, at_edge: Edge | None = None) -> Measurement: ...


class OurEngine:
    """The project's asyncio client in this process: ``drive`` on one ``Caller``."""

    name = "ours"

    def run(self, job: Job, at_edge: Edge | None = None) -> Measurement:
        return asyncio.run(self.run_async(job, at_edge))

    async def run_async(self, job: Job, at_edge: Edge | None = None) -> Measurement:
        """``run`` for callers that already run an event loop (two loads on one server at once)."""
        target, load, label = job.target, job.load, job.label
        settings = sized_for(job.settings, load, job.settings.stable_windows, label)
        t0 = time.perf_counter()
        # a closed loop's workers, one slot each: static batching sends whole batches, so `concurrency`
        # samples in flight are concurrency/collect requests
        slots = max(load.concurrency // max(target.collect, 1), 1) if load.kind == "closed" else None
        edge = (lambda at: asyncio.to_thread(at_edge, at)) if at_edge else None
        async with Caller(target, t0, label, slots) as caller:
            stop, sink = asyncio.Event(), []
            driver = asyncio.create_task(drive(caller, load, stop, sink))
            await asyncio.sleep(settings.warmup_s)
            now = time.perf_counter() - t0
            if edge:
                await edge(now)
            windows: list[tuple[float, float]] = []
            figures: list[tuple[float, float]] = []
            try:
                while len(windows) < settings.max_windows and not driver.done():
                    start = windows[-1][1] if windows else now
                    await asyncio.sleep(max(0.0, start + settings.window_s - (time.perf_counter() - t0)))
                    end = time.perf_counter() - t0
                    windows.append((start, end))
                    if edge:
                        await edge(end)
                    summary = summarize(sink, start, end)
                    figures.append((summary.throughput, summary.mean_ms))
                    if settings.agree(figures):
                        break
            finally:
                stop.set()
                await driver
        used = (max(0, len(windows) - settings.stable_windows), len(windows))
        return job.measurement(self.name, sink, windows, used, settings.agree(figures), caller.attempts)


async def drive(caller: Caller, load: Load, stop: asyncio.Event, sink: list[Record]) -> None:
    """The only code that decides when requests leave, until ``stop``: a closed loop's workers (one per
    slot) send again as their last returns; an open loop's requests leave at their arrival times, late
    or not (latency counts from arrival), ``collect`` arrivals per request; one that finds every slot
    busy is shed and recorded as failed."""
    if load.kind == "open":
        return await _open(caller, load, stop, sink)

    async def worker() -> None:
        while not stop.is_set():
            sink.append(await caller.call(caller.target.collect))

    await asyncio.gather(*(worker() for _ in range(caller.slot_count)))


async def _open(caller: Caller, load: Load, stop: asyncio.Event, sink: list[Record]) -> None:
    assert load.arrivals is not None
    collect = caller.target.collect
    group: list[float] = []

    async def send(arrivals: tuple[float, ...], slot: int) -> None:
        try:
            sink.append(await caller.call(len(arrivals), arrivals, slot))
        finally:
            caller.free.put_nowait(slot)

    start = time.perf_counter() - caller.t0
    async with asyncio.TaskGroup() as sending:  # every request sent is answered before the loop ends
        for offset in load.arrivals():
            arrival = start + offset
            # short naps so a sparse trace still stops promptly
            while (delay := arrival - (time.perf_counter() - caller.t0)) > 0 and not stop.is_set():
                await asyncio.sleep(min(delay, 0.05))
            if stop.is_set():
                break
            group.append(arrival)
            if len(group) < collect:
                continue
            arrivals, group = tuple(group), []
            if caller.free.empty():
                sink.append(caller.shed(arrivals))
                continue
            sending.create_task(send(arrivals, caller.free.get_nowait()))
