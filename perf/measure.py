"""Measure one model at one load: warm up, then measurement windows until three agree (or a cap).

``measure`` is the reusable entry point for any study: give it a ``Target`` and a ``Load`` and it
returns a ``Measurement``: every record (warm-up and drain included, so nothing is lost), the windows,
which of them count, and the server's own view over exactly those windows.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from client.stats import ModelStats
from perf.drive import drive
from perf.errors import OptionError
from perf.loads import Load
from perf.records import Record
from perf.server_view import ServerDelta, ServerEndpoints, ServerSnapshot, delta, snapshot
from perf.summary import Summary, in_span, summarize, window_is_stable
from perf.target import Caller, Target

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MeasureSettings:
    """Like perf_analyzer: ``stable_windows`` consecutive windows within ``tolerance``, at most
    ``max_windows``."""

    warmup_s: float = 1.0
    window_s: float = 2.0
    stable_windows: int = 3
    max_windows: int = 6
    tolerance: float = 0.10

    def __post_init__(self) -> None:
        if not self.window_s > 0:
            raise OptionError(f"window_s (--window) must be > 0 seconds, got {self.window_s}")
        if self.stable_windows < 1:
            raise OptionError(f"stable_windows must be >= 1, got {self.stable_windows}")
        if self.max_windows < self.stable_windows:
            raise OptionError(
                f"max_windows (--max-windows) must be >= stable_windows ({self.stable_windows}), "
                f"got {self.max_windows}"
            )


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
    server: ServerDelta | None = None  # over the used windows
    server_total: ModelStats | None = None  # from before warm-up to after the drain
    extra: dict = field(default_factory=dict)

    @property
    def span(self) -> tuple[float, float]:
        return self.windows[self.used[0]][0], self.windows[self.used[1] - 1][1]

    def summary(self) -> Summary:
        return summarize(self.records, *self.span)

    def measured_records(self) -> list[Record]:
        return in_span(self.records, *self.span)


def _window_figures(records: list[Record], start: float, end: float) -> tuple[float, float]:
    summary = summarize(records, start, end)
    return summary.throughput, summary.mean_ms


def _settled(take: Callable[[float], ServerSnapshot], t0: float) -> ServerSnapshot:
    """A snapshot after the server has finished counting: Triton updates a request's statistics just
    after sending its response, so the last answers of a run can be missing from an immediate read."""
    last = take(time.perf_counter() - t0)
    for _ in range(40):
        time.sleep(0.05)
        again = take(time.perf_counter() - t0)
        if again.stats.requests == last.stats.requests and again.stats.failed == last.stats.failed:
            return again
        last = again
    return last


async def measure_async(
    target: Target, load: Load, settings: MeasureSettings, endpoints: ServerEndpoints | None = None,
    label: str = "", on_window: Callable[[int], None] | None = None, related: tuple[str, ...] = (),
) -> Measurement:  # fmt: skip
    """See ``measure``; for callers that already run an event loop."""
    t0 = time.perf_counter()
    take = (lambda at: snapshot(endpoints, target.model, at, related)) if endpoints else None
    before = take(0.0) if take else None
    slots = max(load.concurrency // max(target.collect, 1), 1) if load.kind == "closed" else None
    async with Caller(target, t0, label, slots) as caller:
        stop, sink = asyncio.Event(), []
        driver = asyncio.create_task(drive(caller, load, stop, sink))
        await asyncio.sleep(settings.warmup_s)
        now = time.perf_counter() - t0
        snaps: list[ServerSnapshot] = [await asyncio.to_thread(take, now)] if take else []
        windows: list[tuple[float, float]] = []
        figures: list[tuple[float, float]] = []
        stable = False
        try:
            while len(windows) < settings.max_windows and not driver.done():
                start = windows[-1][1] if windows else now
                await asyncio.sleep(max(0.0, start + settings.window_s - (time.perf_counter() - t0)))
                end = time.perf_counter() - t0
                windows.append((start, end))
                if take:
                    snaps.append(await asyncio.to_thread(take, end))
                figures.append(_window_figures(sink, start, end))
                if on_window:
                    on_window(len(windows))
                recent = figures[-settings.stable_windows :]
                if len(recent) == settings.stable_windows and all(
                    window_is_stable([f[i] for f in recent], settings.tolerance) for i in (0, 1)
                ):
                    stable = True
                    break
        finally:
            stop.set()
            await driver
        attempts = caller.attempts
    used = (max(0, len(windows) - settings.stable_windows), len(windows))
    measurement = Measurement(label, target.model, load, sink, windows, used, stable, attempts)
    if take:
        measurement.server = delta(snaps[used[0] : used[1] + 1])
        measurement.server_total = _settled(take, t0).stats - before.stats
    if not stable:
        log.info("%s: not stable after %d windows; using the last %d", label, len(windows), used[1] - used[0])
    return measurement


def measure(
    target: Target, load: Load, settings: MeasureSettings | None = None,
    endpoints: ServerEndpoints | None = None, label: str = "", related: tuple[str, ...] = (),
) -> Measurement:  # fmt: skip
    """Measure ``target`` under ``load`` (blocking). ``endpoints`` adds the server's view; ``related``
    models (an ensemble's steps) get their statistics read over the same windows."""
    settings = settings or MeasureSettings()
    return asyncio.run(measure_async(target, load, settings, endpoints, label, related=related))
