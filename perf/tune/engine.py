"""Load engines for the tuner: our generator spread over several client processes.

One asyncio process on two shared cores falls behind a C++ client (measured: perf_analyzer 3,904–4,405
inf/s vs our single process 2,902–3,382 at c=16), so the tuner sends open-loop arrivals from
``processes`` worker processes. The parent draws the whole arrival sequence (the very one the batcher
simulation replays), deals arrival ``k`` to worker ``k mod processes`` (a split Poisson stream is still
Poisson) and gives every worker the same absolute start on the shared monotonic clock, so their
records merge into one timeline. Closed loops split the concurrency the same way. Each worker runs the
project's ``Caller`` and ``drive``; nothing here times a request itself.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from perf.drive import drive
from perf.errors import OptionError
from perf.loads import Load, closed_loop
from perf.records import Record
from perf.target import Caller, Target

START_MARGIN_S = 0.4  # time the workers get to connect before the first arrival
ENGINES = ("auto", "ours", "perf_analyzer")  # ``python -m perf tune --engine``


class Engine(Protocol):
    """What the tuner needs of a load engine: ``LoadEngine`` here, ``PerfAnalyzerEngine`` in pa_engine."""

    last_start: float  # perf_counter of t = 0 of the latest run (records' clock)

    @property
    def name(self) -> str: ...

    def __enter__(self) -> Engine: ...

    def __exit__(self, *exc_info: object) -> None: ...

    def open_loop(self, target: Target, arrivals_s: Sequence[float], label: str) -> list[Record]: ...

    def closed_loop(self, target: Target, concurrency: int, seconds: float, label: str) -> list[Record]: ...


def engine_name(args: argparse.Namespace) -> str:
    """``--engine auto``: perf_analyzer where it is installed, since it keeps up where our generator
    does not (measured at c=16: ours 18-39% below it), except with ``--follow`` (it aborts after a
    reload); our generator otherwise."""
    chosen = getattr(args, "engine", "ours")
    if chosen != "auto":
        return chosen
    from perf.analyzer import find_perf_analyzer

    return "ours" if getattr(args, "follow", False) or find_perf_analyzer() is None else "perf_analyzer"


def engine_from_args(args: argparse.Namespace) -> Engine:
    """The engine ``--engine`` names (``ours``: ``--processes`` client processes of our generator)."""
    if engine_name(args) == "perf_analyzer":
        from perf.tune.pa_engine import PerfAnalyzerEngine

        return PerfAnalyzerEngine()
    return LoadEngine(args.processes)


@dataclass(frozen=True)
class Task:
    target: Target
    start_at: float  # absolute time.perf_counter() of t = 0, shared by every worker
    label: str
    offsets: tuple[float, ...] = ()  # open loop: this worker's arrival times (s after start)
    concurrency: int = 0  # closed loop: this worker's share
    seconds: float = 0.0  # closed loop: how long


async def _run(task: Task) -> list[Record]:
    sink: list[Record] = []
    stop = asyncio.Event()
    slots = task.concurrency or None
    async with Caller(task.target, task.start_at, task.label, slots) as caller:
        await asyncio.sleep(max(0.0, task.start_at - time.perf_counter()))
        if task.concurrency:
            load = closed_loop(task.concurrency)
            asyncio.get_running_loop().call_later(task.seconds, stop.set)
        else:
            offsets = task.offsets
            load = Load("open", task.label, arrivals=lambda: iter(offsets))
        await drive(caller, load, stop, sink)
    return sink


def _import_client_stack() -> None:
    """Worker initializer: pay the imports (tritonclient, numpy, torch via the exporters) before the
    first timed run, or the first arrivals of a run would wait for them."""
    import perf.target  # noqa: F401


def _ready(_: int) -> bool:
    time.sleep(0.2)  # long enough that every worker takes one of these
    return True


def run_task(task: Task) -> list[Record]:
    """One worker's share (a process entry point: picklable arguments, records back)."""
    return asyncio.run(_run(task))


class LoadEngine:
    """``processes`` client processes, started once and reused; use as a context manager."""

    def __init__(self, processes: int = 2) -> None:
        if processes < 1:
            raise OptionError(f"processes must be >= 1, got {processes}")
        self.processes = processes
        self._pool = None
        self.last_start = 0.0  # perf_counter of t = 0 of the latest run (records' clock)

    @property
    def name(self) -> str:
        return f"ours ({self.processes} process{'es' if self.processes > 1 else ''})"

    def __enter__(self) -> LoadEngine:
        if self.processes > 1:
            self._pool = multiprocessing.get_context("spawn").Pool(self.processes, _import_client_stack)
            self._pool.map(_ready, range(self.processes), chunksize=1)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None

    def _map(self, tasks: list[Task]) -> list[Record]:
        parts = self._pool.map(run_task, tasks) if self._pool else [run_task(task) for task in tasks]
        return sorted(
            (r for part in parts for r in part), key=lambda r: r.arrivals[0] if r.arrivals else r.send_s
        )

    def open_loop(self, target: Target, arrivals_s: Sequence[float], label: str) -> list[Record]:
        """Send one request per arrival time (seconds from the start); records on one timeline."""
        arrivals = np.asarray(arrivals_s, dtype=float)
        start = self.last_start = time.perf_counter() + START_MARGIN_S
        tasks = [
            Task(target, start, label, offsets=tuple(arrivals[k :: self.processes].tolist()))
            for k in range(self.processes)
        ]
        return self._map(tasks)

    def closed_loop(self, target: Target, concurrency: int, seconds: float, label: str) -> list[Record]:
        """``concurrency`` requests in flight in all, split over the processes, for ``seconds``."""
        shares = [
            concurrency // self.processes + (k < concurrency % self.processes) for k in range(self.processes)
        ]
        start = self.last_start = time.perf_counter() + START_MARGIN_S
        tasks = [Task(target, start, label, concurrency=share, seconds=seconds) for share in shares if share]
        return self._map(tasks)
