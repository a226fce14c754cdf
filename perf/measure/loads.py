"""Load shapes: small functions that say *when* requests go out; an open loop's arrivals come from a
factory, so that every run replays the same sequence."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from perf.errors import OptionError, per_second

ArrivalFactory = Callable[[], Iterator[float]]


@dataclass(frozen=True)
class Load:
    """``kind`` is ``closed`` (``concurrency`` samples in flight) or ``open`` (``arrivals`` times)."""

    kind: str
    name: str
    concurrency: int = 0
    rate: float = 0.0  # mean arrivals per second (open loop), for reports
    arrivals: ArrivalFactory | None = None


def closed_loop(concurrency: int) -> Load:
    if concurrency < 1:
        raise OptionError(f"concurrency must be >= 1, got {concurrency}")
    return Load("closed", f"concurrency {concurrency}", concurrency=concurrency)


def poisson(rate: float, seed: int = 0) -> Load:
    """Poisson arrivals at ``rate`` per second: exponential inter-arrival times from a seeded generator."""
    if rate <= 0:
        raise OptionError(f"rate must be > 0, got {rate}")

    def arrivals() -> Iterator[float]:
        rng = np.random.default_rng(seed)
        now = 0.0
        while True:
            for gap in rng.exponential(1.0 / rate, 4096):
                now += gap
                yield now

    return Load("open", f"Poisson {per_second(rate)}", rate=rate, arrivals=arrivals)


def trace(inter_arrival_s: Sequence[float], name: str = "trace") -> Load:
    """Replay recorded inter-arrival times (seconds), cycling when the trace runs out."""
    gaps = [float(g) for g in inter_arrival_s]
    if not gaps or any(g < 0 for g in gaps) or sum(gaps) <= 0:
        raise OptionError("a trace needs non-negative inter-arrival times with a positive sum")

    def arrivals() -> Iterator[float]:
        return itertools.accumulate(itertools.cycle(gaps))

    return Load("open", name, rate=len(gaps) / sum(gaps), arrivals=arrivals)


def arrival_times(load: Load, seconds: float, limit: int | None = 200_000) -> np.ndarray:
    """The first ``seconds`` of an open ``load``'s arrivals (at most ``limit``; None: all of them)."""
    if load.arrivals is None:
        raise OptionError(f"{load.name}: a closed loop has no arrival times")
    times = itertools.takewhile(lambda t: t <= seconds, load.arrivals())
    return np.fromiter(itertools.islice(times, limit), dtype=float)


def read_trace(path: str) -> Load:
    """A trace file: one inter-arrival time in seconds per line (``#`` comments allowed)."""
    with open(path) as handle:
        gaps = [float(line.split("#")[0]) for line in handle if line.split("#")[0].strip()]
    return trace(gaps, name=f"trace {path}")
