"""Every strategy placed, predicted and judged; the pick: the highest rate within the budget, ties
(within ``TIE_SHARE``) to fewer devices, instances, then delay; every other strategy says why it lost."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from perf.measure.loads import poisson
from perf.model.links import Transfer
from perf.model.predict import Prediction, capacity_bound, highest_rate, predict
from perf.model.tandem import TandemStage, predict_tandem, tandem_bound
from perf.plan.placement import Placement, PlacementError, place, with_exchange
from perf.plan.strategy import WHOLE_KINDS, ModelProfile, Space, Strategy, strategies
from perf.plan.topology import Topology

ARRIVALS = 15_000  # a prediction simulates at most this many arrivals per replica (p99 from 150 tail samples)
TIE_SHARE = 0.03  # rates within 3% of the best tie (the simulation's own spread between seeds)
KIND_ORDER = {"data": 0, "pipeline": 1, "hybrid": 2, "sharded": 3}


@dataclass(frozen=True)
class PlanRequest:
    budget_ms: float
    max_error: float | None = None  # the accuracy tolerance: max relative error vs fp32 (None: any)
    space: Space = field(default_factory=Space)
    predict_s: float = 4.0
    seed: int = 0


@dataclass
class Judged:
    """One strategy: where it goes, what it is predicted to do, and why it lost (empty for the pick)."""

    strategy: Strategy
    placement: Placement | None = None
    best: Prediction | None = None  # per replica, at its highest rate within the budget
    rate: float = 0.0  # all replicas together
    error: float = 0.0
    link_bound: str = ""
    reason: str = ""

    @property
    def feasible(self) -> bool:
        return self.placement is not None and self.best is not None


@dataclass
class Plan:
    request: PlanRequest
    profile: ModelProfile
    topology: Topology
    judged: list[Judged]  # best first
    chosen: Judged


class Predictor:
    """One placed strategy predicted at any total rate (a split: one replica over its slowest links)."""

    def __init__(self, strategy: Strategy, profile: ModelProfile, placement: Placement, request: PlanRequest):
        self.strategy, self.request = strategy, request
        self.whole = strategy.kind in WHOLE_KINDS
        self.replicas = 1 if self.whole else strategy.replicas
        self.overhead_s = profile.overheads.overhead_s
        costs = profile.costs(strategy)
        if strategy.kind == "sharded" and placement.exchange is not None:
            costs = (with_exchange(costs[0], placement.exchange),)
        self.stages = [
            TandemStage(strategy.batcher(k), profile.overheads.service(cost, instances, strategy.stages))
            for k, (cost, instances) in enumerate(zip(costs, strategy.instances, strict=True))
        ]
        # the whole model crosses no boundary (a sharded exchange is in its service); a split's replica
        # with the slowest links is the one predicted
        slowest = min(placement.links, key=lambda links: min((lk.gbs for lk in links), default=float("inf")))
        crossed = () if self.whole else slowest
        self.transfers = [Transfer(costs[k].out_bytes_per_sample, link) for k, link in enumerate(crossed)]

    def at(self, rate: float) -> Prediction:
        """The prediction at ``rate`` requests/s in all (one replica's share of it for a split)."""
        seconds = min(self.request.predict_s, ARRIVALS * self.replicas / rate)
        load = poisson(rate / self.replicas, self.request.seed)
        if self.whole:
            (stage,) = self.stages
            return predict(stage.config, stage.service, load, seconds)
        found = predict_tandem(self.stages, self.transfers, load, self.overhead_s, seconds)
        return replace(found, rate=rate, throughput=found.throughput * self.replicas)

    @property
    def bound(self) -> float:
        """Requests/s in all at most: every instance at full batches (a split: its slowest stage or link)."""
        return tandem_bound(self.stages, self.transfers) * self.replicas

    def link_bound(self) -> str:
        """Why the links, not the stages, bound this split (empty if they do not)."""
        if not self.transfers:
            return ""
        computes = min(capacity_bound(s.config, s.service) for s in self.stages)
        batch = self.strategy.max_batch
        slowest = min(self.transfers, key=lambda t: t.capacity(batch))
        carried = slowest.capacity(batch)
        if carried >= computes:
            return ""
        return (
            f"link-bound: its boundary over {slowest.link.label} carries at most {carried:,.0f}/s, "
            f"its stages compute {computes:,.0f}/s"
        )


def judge(strategy: Strategy, profile: ModelProfile, topology: Topology, request: PlanRequest) -> Judged:
    judged = Judged(strategy, error=profile.error_of(strategy))
    try:
        judged.placement = place(
            strategy, profile.costs(strategy), topology, profile.split_of(strategy), profile.tables
        )
    except PlacementError as error:
        judged.reason = str(error)
        return judged
    if request.max_error is not None and judged.error > request.max_error:
        judged.reason = (
            f"over the accuracy tolerance: max relative error {judged.error:.2e} > {request.max_error:g}"
        )
        return judged
    predictor = Predictor(strategy, profile, judged.placement, request)
    judged.link_bound = predictor.link_bound()
    best = highest_rate(predictor.at, predictor.bound, request.budget_ms, scan=6, steps=5)
    if best is None:
        judged.reason = f"over budget: p99 above {request.budget_ms:g} ms at every rate"
        return judged
    judged.best, judged.rate = best, best.rate
    return judged


def _order(judged: list[Judged]) -> list[Judged]:
    top = max((j.rate for j in judged if j.feasible), default=0.0)

    def key(j: Judged) -> tuple:
        s = j.strategy
        tied = j.feasible and j.rate >= (1 - TIE_SHARE) * top
        return (
            not j.feasible,
            not tied,
            s.devices if tied else 0,
            sum(s.instances) * s.replicas if tied else 0,
            -j.rate,
            KIND_ORDER[s.kind],
            s.delay_us,
        )

    return sorted(judged, key=key)


class NoStrategyError(PlacementError):
    """No strategy is feasible; ``judged`` says why each lost (over budget apart from does not fit)."""

    def __init__(self, message: str, judged: list[Judged]) -> None:
        super().__init__(message)
        self.judged = judged


def plan(
    profile: ModelProfile, topology: Topology, request: PlanRequest, step: Callable[[str], None] | None = None
) -> Plan:
    """Judge every strategy of ``request.space`` and pick."""
    candidates = strategies(profile, len(topology.gpus), request.space)
    if step:
        step(f"predicting {len(candidates)} strategies on {topology.name}")
    judged = _order([judge(s, profile, topology, request) for s in candidates])
    chosen = judged[0]
    if not chosen.feasible:
        reasons = "; ".join(sorted({j.reason.split(":")[0] for j in judged}))
        first = f"{chosen.strategy.label}: {chosen.reason}"
        where = f"within p99 {request.budget_ms:g} ms on {topology.name}"
        raise NoStrategyError(f"no strategy fits {where}: {reasons} (first: {first})", judged)
    for other in (j for j in judged[1:] if j.feasible):
        other.reason = lost_to(other, chosen)
    return Plan(request, profile, topology, judged, chosen)


def lost_to(other: Judged, chosen: Judged) -> str:
    """Why the feasible ``other`` lost to the prediction's pick ``chosen``, by their predicted rates (and
    where its links bound it, that too); verification writes it again where the pick answers after all."""
    lower = f"lower rate: {other.rate:,.0f}/s against {chosen.rate:,.0f}/s"
    if other.rate >= (1 - TIE_SHARE) * chosen.rate:
        lower = f"ties on rate ({other.rate:,.0f}/s); the pick needs no more devices, instances or delay"
    return f"{lower}{'; ' + other.link_bound if other.link_bound else ''}"


def curve(judged: Judged, profile: ModelProfile, request: PlanRequest, points: int = 8) -> list[Prediction]:
    """Predicted p99 from a fifth of the strategy's rate to 1.2× it (the report's plot)."""
    assert judged.placement is not None
    predictor = Predictor(judged.strategy, profile, judged.placement, request)
    return [predictor.at(judged.rate * (0.2 + k / (points - 1))) for k in range(points)]
