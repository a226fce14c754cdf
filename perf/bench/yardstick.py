"""One yardstick for several configurations: the same load, the same engine, the same server, rounds
interleaved, so that what the host does meanwhile falls on all of them alike.

Two views of each configuration, both through the session's engine (perf_analyzer, the project's one
command line ``perf.measure.analyzer``) and its noise policy:

* **open loop** (the tuner's question): Poisson arrivals from ``start`` in steps of ``step`` until a
  run misses the budget; the highest rate a run met it at, and the p99 there;
* **closed loop** (what Model Analyzer reports): concurrency 4, 8, 16, … until a run misses the budget;
  the highest concurrency within it, its throughput and p99.

A configuration's figure is never a guess between runs: the last rate (or concurrency) a run met the
budget at, or none where the first already missed.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from perf.errors import StudyError
from perf.measure.loads import Load, closed_loop, poisson
from perf.model.batcher import BatcherConfig
from perf.session.model import ModelSession

log = logging.getLogger(__name__)
DOWN_STEPS = 2  # an open ramp whose first run misses starts again from half the rate, this many times


@dataclass(frozen=True)
class Step:
    """One run of a ramp: the load (rate or concurrency) and what it measured."""

    load: float
    p99_ms: float
    throughput: float
    met: bool
    stolen_pct: float
    host_noise: bool
    error: str = ""  # perf_analyzer gave no measurement (e.g. a closed loop whose windows never agreed)


@dataclass
class Ramp:
    """One configuration's ramp in one round."""

    name: str
    round: int
    kind: str  # "open" or "closed"
    steps: list[Step] = field(default_factory=list)
    start: float = 0.0  # where an open ramp started (below the plan's start where that missed)

    @property
    def held(self) -> Step | None:
        """The last run within the budget before the first miss (a run without a measurement is
        neither)."""
        return held(self.steps)


def held(steps: Sequence[Step]) -> Step | None:
    """The last step within the budget before the first miss; steps without a measurement skipped."""
    last = None
    for step in steps:
        if step.error:
            continue
        if not step.met:
            break
        last = step
    return last


@dataclass(frozen=True)
class Plan:
    """The yardstick's settings: the open loop's first rate and step, the rounds."""

    budget_ms: float
    start: float
    step: float
    rounds: int = 3
    seed: int = 0
    max_steps: int = 16  # open-loop runs per ramp at most: a hang guard, far above what a budget allows
    first_concurrency: int = 4  # below it a closed loop is far inside any budget worth tuning for
    max_concurrency: int = 64


def _step(session: ModelSession, load: Load, value: float, label: str, budget_ms: float) -> Step:
    """One run; perf_analyzer's failure to measure becomes a step without a measurement."""
    try:
        run = session.measure(load, label)
    except StudyError as error:
        log.warning("%s: no measurement: %s", label, error)
        return Step(value, math.nan, math.nan, False, math.nan, False, str(error).splitlines()[-1][:200])
    holds_noise = session.noise.holds_noise(run)
    return Step(value, run.p99_ms, run.throughput, run.meets(budget_ms), 100 * run.stolen_share, holds_noise)


def open_ramp(session: ModelSession, name: str, plan: Plan, round_: int) -> Ramp:
    """Poisson from ``plan.start`` in steps of ``plan.step`` until a run misses the budget; where the
    first run misses already, from half that rate (at most ``DOWN_STEPS`` times) instead."""
    ramp = Ramp(name, round_, "open")
    start = plan.start
    for k in range(plan.max_steps):
        rate = start + len(ramp.steps) * plan.step if ramp.steps and ramp.steps[-1].met else start
        seed = plan.seed + 1000 * round_ + k
        label = f"yardstick {name} round {round_} @ {rate:.0f}/s"
        ramp.steps.append(_step(session, poisson(rate, seed), rate, label, plan.budget_ms))
        if ramp.steps[-1].met:
            continue
        if held(ramp.steps) is not None or k >= DOWN_STEPS:  # a failed call ends it too
            break
        start = rate / 2
        ramp.steps.clear()  # a ramp from a lower start: the misses above it stay in perf_analyzer.log
    ramp.start = start
    return ramp


def closed_ramp(session: ModelSession, name: str, plan: Plan, round_: int) -> Ramp:
    """Concurrency ``plan.first_concurrency``, twice that, … until a run misses the budget."""
    ramp = Ramp(name, round_, "closed")
    concurrency = plan.first_concurrency
    while concurrency <= plan.max_concurrency:
        label = f"yardstick {name} round {round_} c={concurrency}"
        ramp.steps.append(_step(session, closed_loop(concurrency), concurrency, label, plan.budget_ms))
        last = ramp.steps[-1]
        if not last.met and not last.error:  # windows that never agree say nothing of the budget
            break
        concurrency *= 2
    return ramp


def ramp_from(rate: float) -> tuple[float, float]:
    """The open loop's first rate and step for configurations around ``rate`` (the tuner's measured
    highest rate): steps of a tenth of it, rounded to 50/s, from two steps up."""
    step = max(50.0, 50.0 * round(rate / 10 / 50))
    return 2 * step, step


def measure_all(
    session: ModelSession,
    configs: dict[str, BatcherConfig],
    plan: Plan,
    step: Callable[[str], None] = lambda text: None,
) -> list[Ramp]:
    """Every configuration's open and closed ramps, ``plan.rounds`` rounds, configurations interleaved
    (each round in another order, so none is always measured first after a reload). Names that say
    the same configuration (a pick that is the spec's own) share its ramps: it is measured once."""
    aliases: dict[BatcherConfig, list[str]] = {}
    for name, config in configs.items():
        aliases.setdefault(config, []).append(name)
    unique = list(aliases)
    ramps = []
    for index in range(plan.rounds):
        shift = index % len(unique)
        for config in unique[shift:] + unique[:shift]:
            first, *others = aliases[config]
            step(f"yardstick round {index + 1}: {' = '.join(aliases[config])} ({config.label})")
            session.prepare(config)
            measured = [
                open_ramp(session, first, plan, index + 1),
                closed_ramp(session, first, plan, index + 1),
            ]
            ramps += measured + [dataclasses.replace(r, name=name) for name in others for r in measured]
    return ramps


@dataclass(frozen=True)
class RampFigures:
    """One ramp as the saved result holds it."""

    name: str
    round: int
    kind: str  # "open" or "closed"
    start: float
    steps: tuple[Step, ...]

    @property
    def held(self) -> Step | None:
        """The last run within the budget before the first miss (``held``)."""
        return held(self.steps)


def figures(ramps: list[Ramp]) -> tuple[RampFigures, ...]:
    """The ramps as the saved result holds them."""
    return tuple(RampFigures(r.name, r.round, r.kind, r.start, tuple(r.steps)) for r in ramps)
