"""One yardstick for several configurations: the same load, the same engine, the same server, rounds
interleaved, so that what the host does meanwhile falls on all of them alike.

Two views of each configuration, both through the session's engine (perf_analyzer, the project's one
command line ``perf.measure.analyzer``) and its noise policy:

* **open loop** (the tuner's question): the one measured search (``perf.session.search``, the same as
  ``make tune`` and ``make plan``) from the tuner's measured rate, Poisson arrivals: the highest rate a
  point held the budget at by the search's rule, and the p99 there;
* **closed loop** (what Model Analyzer reports): concurrency 4, 8, 16, … each point decided by the same
  rule (a miss alone is measured again), until one misses; the highest concurrency that held, its
  throughput and p99.

A configuration's figure is never a guess between runs: the highest rate (or concurrency) a point held
the budget at, or none. A run perf_analyzer could not measure (a closed loop whose windows never agreed)
is kept as a step without a measurement: in the open loop it counts as a miss by far, in the closed
loop it is skipped.
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
from perf.session.search import Evidence, SearchPlan, Verdict, decide, search

log = logging.getLogger(__name__)


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


@dataclass(frozen=True)
class StepRun:
    """A step as the search's rule reads a run."""

    step: Step
    label: str = ""

    @property
    def p99_ms(self) -> float:
        return self.step.p99_ms

    @property
    def throughput(self) -> float:
        return self.step.throughput if math.isfinite(self.step.throughput) else 0.0

    @property
    def sustained(self) -> bool:
        return not self.step.error

    def meets(self, budget_ms: float) -> bool:
        return self.step.met


@dataclass
class Ramp:
    """One configuration's ramp in one round."""

    name: str
    round: int
    kind: str  # "open" or "closed"
    steps: list[Step] = field(default_factory=list)
    start: float = 0.0  # where an open ramp's search started


def held_at(steps: Sequence[Step], budget_ms: float, kind: str) -> float | None:
    """The highest load a point of ``steps`` held the budget at by the search's rule (a closed-loop step
    without a measurement skipped), or None."""
    evidence: Evidence[str] = Evidence(budget_ms)
    for step in steps:
        if not (step.error and kind == "closed"):
            evidence.add(kind, step.load, StepRun(step))
    return evidence.held_rate(kind) or None


@dataclass(frozen=True)
class Plan:
    """The yardstick's settings: the open loop's first rate, the rounds, the closed loop's range."""

    budget_ms: float
    start: float
    rounds: int = 3
    seed: int = 0
    max_steps: int = SearchPlan().max_points  # rates per open search at most (the search's guard)
    first_concurrency: int = 4  # below it a closed loop is far inside any budget worth tuning for
    max_concurrency: int = 64


class Recorder:
    """The session as the search sees it, keeping every run as a step (a failed one as a step without
    a measurement, which the rule reads as a miss by far)."""

    def __init__(self, session: ModelSession, budget_ms: float) -> None:
        self.session, self.budget_ms = session, budget_ms
        self.steps: list[Step] = []

    def measure(self, load: Load, label: str) -> StepRun:
        value = load.rate or float(load.concurrency)
        try:
            run = self.session.measure(load, label)
        except StudyError as error:
            log.warning("%s: no measurement: %s", label, error)
            reason = str(error).splitlines()[-1][:200]
            step = Step(value, math.nan, math.nan, False, math.nan, False, reason)
        else:
            noisy = self.session.noise.holds_noise(run)
            step = Step(
                value, run.p99_ms, run.throughput, run.meets(self.budget_ms), 100 * run.stolen_share, noisy
            )
        self.steps.append(step)
        return StepRun(step, label)


def open_ramp(session: ModelSession, name: str, plan: Plan, round_: int) -> Ramp:
    """The one measured search from ``plan.start``, Poisson arrivals of this round's seed."""
    recorder = Recorder(session, plan.budget_ms)
    evidence: Evidence[str] = Evidence(plan.budget_ms)
    seed = plan.seed + 1000 * round_
    search(
        recorder, evidence, name, lambda rate: poisson(rate, seed), plan.start,
        plan=SearchPlan(max_points=plan.max_steps), label=f"yardstick {name} round {round_}",
    )  # fmt: skip
    return Ramp(name, round_, "open", recorder.steps, plan.start)


def closed_ramp(session: ModelSession, name: str, plan: Plan, round_: int) -> Ramp:
    """Concurrency ``plan.first_concurrency``, twice that, … each decided by the search's rule, until
    one misses the budget (one perf_analyzer could not measure says nothing of the budget: skipped)."""
    recorder = Recorder(session, plan.budget_ms)
    evidence: Evidence[str] = Evidence(plan.budget_ms)
    concurrency = plan.first_concurrency
    while concurrency <= plan.max_concurrency:
        found = decide(
            recorder, evidence, name, float(concurrency), lambda c: closed_loop(int(c)),
            f"yardstick {name} round {round_} c={concurrency}",
        )  # fmt: skip
        if found is Verdict.MISSES and not recorder.steps[-1].error:
            break
        concurrency *= 2
    return Ramp(name, round_, "closed", recorder.steps)


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
    """One ramp as the saved result holds it: its steps, and the highest load a point held the budget
    at by the search's rule (None: none held)."""

    name: str
    round: int
    kind: str  # "open" or "closed"
    start: float
    steps: tuple[Step, ...]
    held_at: float | None = None

    @property
    def held(self) -> Step | None:
        """The last step at ``held_at`` (its p99 and throughput are the figure's)."""
        return next((s for s in reversed(self.steps) if s.load == self.held_at and s.met), None)


def figures(ramps: list[Ramp], budget_ms: float) -> tuple[RampFigures, ...]:
    """The ramps as the saved result holds them."""
    return tuple(
        RampFigures(r.name, r.round, r.kind, r.start, tuple(r.steps), held_at(r.steps, budget_ms, r.kind))
        for r in ramps
    )
