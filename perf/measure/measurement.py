"""One measurement, whatever sends the load (``measure``): the engine's ``Measurement``, which every
study and the tuner read, with the server's view over exactly the windows that count where the engine
runs in this process."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from perf.measure.engine import Job, LoadEngine, Measurement, MeasureSettings, OurEngine
from perf.measure.loads import Load
from perf.measure.server_view import ServerEndpoints, ServerSnapshot, delta, snapshot
from perf.measure.target import Target

log = logging.getLogger(__name__)


def too_few_text(samples: int) -> str:
    """How reports name a run whose p99 rests on too few requests (``too_few``)."""
    return f"too few requests: {samples}"


def too_few_note(samples: int, too_few: bool) -> str:
    """`` (too few requests: N)`` after a run's p99 where it was too few."""
    return f" ({too_few_text(samples)})" if too_few else ""


def measure(
    target: Target, load: Load, settings: MeasureSettings | None = None,
    endpoints: ServerEndpoints | None = None, label: str = "", related: tuple[str, ...] = (),
    engine: LoadEngine | None = None,
) -> Measurement:  # fmt: skip
    """Measure ``target`` under ``load`` with ``engine`` (ours by default); ``endpoints`` adds the
    server's view, of the ``related`` models (an ensemble's steps) too."""
    engine = engine or OurEngine()
    settings = settings or MeasureSettings()
    started = time.perf_counter()
    take = (lambda: snapshot(endpoints, target.model, time.perf_counter(), related)) if endpoints else None
    before = take() if take else None
    edges: list[ServerSnapshot] = []
    at_edge = (lambda _at: edges.append(take())) if take else None
    measurement = engine.run(Job(target, load, settings, label), at_edge)
    first, last = measurement.used
    if take and before:
        after = _settled(take)
        measurement.server = delta(edges[first : last + 1] if edges else [before, after])
        measurement.server_total = after.stats - before.stats
    measurement.wall_s = time.perf_counter() - started
    if not measurement.stable:
        log.info("%s: windows did not agree; counting the last %d", label, last - first)
    return measurement


async def measure_async(
    target: Target, load: Load, settings: MeasureSettings, label: str = ""
) -> Measurement:
    """``measure`` with our engine inside a running event loop (two loads at once); no server view."""
    started = time.perf_counter()
    measurement = await OurEngine().run_async(Job(target, load, settings, label))
    measurement.wall_s = time.perf_counter() - started
    return measurement


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
