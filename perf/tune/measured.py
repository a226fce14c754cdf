"""Sustainable rates found by measurement alone: the brute force, its head-to-head rematch, and the
tuner's shortlist.

All three use one rule (``measured_max_rate``): a bisection on the offered rate, each point an open
loop on the same Poisson arrivals the prediction used, a point that misses the budget measured once more
(on a shared machine a miss can be a neighbour's doing, a pass cannot). The brute force bisects the
whole range ``(0, ceiling]`` for every candidate of the grid (what Model Analyzer does); the shortlist
starts at the simulation's prediction and bisects a bracket around it, so it costs a few points per
candidate instead of a sweep.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from perf.tune.batcher_sim import BatcherConfig
from perf.tune.predict import arrival_array
from perf.tune.session import Observed, TuneSession

if TYPE_CHECKING:  # the tuner imports this module; these are for the type hints only
    from perf.tune.tuner import Ranked, TuneRequest

log = logging.getLogger(__name__)
Step = Callable[[str], None]


@dataclass
class SweepEntry:
    config: BatcherConfig
    rate: float  # measured sustainable rate (0: no rate tried met the budget)
    points: list[Observed]
    seconds: float


def measured_max_rate(
    session: TuneSession,
    request: TuneRequest,
    config: BatcherConfig,
    ceiling: float,
    steps: int = 5,
    first: float | None = None,
    floor: float = 0.0,
    purpose: str = "sweep",
) -> SweepEntry:
    """The highest rate in ``(floor, ceiling]`` that met the budget, by measurement: a first point (at
    ``first``, or the middle), then ``steps`` halvings of the bracket. 0 when no point met it (a
    bracket's floor is never assumed to pass)."""
    started = time.perf_counter()
    session.load(config)
    low, high, runs, passed = floor, ceiling, [], 0.0
    for index in range(steps + 1):
        rate = first if index == 0 and first else (low + high) / 2
        arrivals = arrival_array(request.load(rate), request.seconds)
        for _attempt in range(2):  # a miss is measured once more: the same rule as verification's repeats
            run = session.open_loop(arrivals, f"{purpose} {config.label} @ {rate:.0f}/s")
            runs.append(run)
            log.info(
                "%s: p99 %.1f ms, served %.0f/s, %d failed", run.label, run.p99_ms, run.throughput, run.failed
            )
            if run.meets(request.budget_ms):
                break
        if run.meets(request.budget_ms):
            low, passed = rate, max(passed, rate)
        else:
            high = rate
    return SweepEntry(config, passed, runs, time.perf_counter() - started)


def exhaustive(
    session: TuneSession, request: TuneRequest, ceiling: float, step: Step | None = None
) -> list[SweepEntry]:
    """Every candidate of the grid, measured; best first."""
    step = step or (lambda text: None)
    entries = []
    for config in request.grid.candidates(request.budget_ms):
        step(f"brute force: {config.label}")
        entries.append(measured_max_rate(session, request, config, ceiling))
    return sorted(entries, key=lambda e: -e.rate)


def rematch(
    session: TuneSession,
    request: TuneRequest,
    configs: list[BatcherConfig],
    ceiling: float,
    rounds: int = 2,
    step: Step | None = None,
) -> dict[BatcherConfig, list[SweepEntry]]:
    """``configs`` (the sweep's best and the tuner's pick) measured again by the sweep's own rule,
    head to head: ``rounds`` rounds, each measuring every config once, so a neighbour's burst of CPU
    that cut one candidate's figure in the sweep hits both alike here. The sweep ran its candidates
    minutes apart, one bisection each: on a shared machine one disturbed point halves a figure."""
    step = step or (lambda text: None)
    out: dict[BatcherConfig, list[SweepEntry]] = {config: [] for config in dict.fromkeys(configs)}
    for round_index in range(rounds):
        for config in out:
            step(f"rematch {round_index + 1}/{rounds}: {config.label}")
            out[config].append(measured_max_rate(session, request, config, ceiling))
    return out


def shortlist(ranking: list[Ranked], size: int, window: float = 0.75) -> list[Ranked]:
    """The candidates the tuner measures before it picks: the best predicted of each family (instance
    count and max batch size), best first, those predicted within ``window`` of the top, at most
    ``size``. The simulation follows the batcher's rules exactly, so within a family it ranks delays
    well; across families it rests on the probe's cost model, whose weakest part is what instances
    sharing the cores cost each other (measured: two-instance configs sustained up to 1.5× the
    predicted rate). ``ranking``: the candidates predicted to meet the budget, best first."""
    if not ranking or size < 1:
        return []
    top = ranking[0].rate
    picked: dict[tuple[int, int], Ranked] = {}
    for entry in ranking:
        family = (entry.config.instances, entry.config.max_batch_size)
        if family not in picked and entry.rate >= window * top:
            picked[family] = entry
    return list(picked.values())[:size]


def measure_shortlist(
    session: TuneSession,
    request: TuneRequest,
    entries: list[Ranked],
    step: Step | None = None,
    bracket: tuple[float, float] = (0.6, 1.5),
    steps: int = 2,
) -> list[SweepEntry]:
    """Each shortlisted candidate's sustainable rate, measured: a first point at its predicted rate,
    then ``steps`` halvings of ``bracket`` × that rate (two: within ±6% of the prediction's
    neighbourhood in three points, about 20 s a candidate here). Best measured first (ties: the model's
    order)."""
    step = step or (lambda text: None)
    out = []
    for entry in entries:
        center = entry.rate or request.rate or 0.0  # with a target rate, a candidate may have no best
        if center <= 0:
            continue
        step(f"shortlist: measuring {entry.config.label} around {center:.0f}/s")
        low, high = (factor * center for factor in bracket)
        out.append(measured_max_rate(session, request, entry.config, high, steps, center, low, "shortlist"))
    return sorted(out, key=lambda e: -e.rate)
