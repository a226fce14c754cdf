"""The tuner, as a pipeline: ``probe`` → ``rank`` every candidate by the batcher simulation →
``shortlist``: the best predicted of each family searched on the server → ``settle``: the answer, the
best point a run on the server held the budget at (docs/TUNE.md, "What it does").

Every run, the probe's too, is evidence about its configuration at its rate, so the answer is decided
by the search's rule over all of them (``perf.session.search``): a prediction that nothing fits does
not override a measurement, and a later run that misses at the answer's rate or below reopens it.
Every run goes through the ``Server`` handed in, which owns how a run is measured (load engine,
windows, the host-noise policy); the tuner only asks "this configuration at this rate".
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

from perf.errors import StudyError
from perf.markdown import number
from perf.measure.loads import Load, poisson
from perf.measure.measurement import Measurement
from perf.model.batcher import BatcherConfig
from perf.model.grid import Grid, neighbours
from perf.model.predict import LoadAt, Prediction, max_rate, predict
from perf.session.probe import ProbePlan, ProbeResult, Server, probe
from perf.session.search import Evidence, Verdict, at_rung, decide, rung, search

Step = Callable[[str], None]
# The caller's further check of the answer at its rate (the shapes step), whose runs join the evidence.
Recheck = Callable[[BatcherConfig, float, Evidence[BatcherConfig]], object]
VERIFY_RUNGS = (-6, -3, 0, 1)  # the answer at 50, 71, 100 and 112% of its measured rate (ladder rungs)
NEIGHBOUR_RUNGS = (-3, 0)  # its neighbours one delay step either side, at 71 and 100%
SETTLE_ROUNDS = 24  # a hang guard: each round searches, verifies or refutes something new


@dataclass(frozen=True)
class TuneRequest:
    budget_ms: float
    rate: float | None = None  # None: the highest rate within the budget
    grid: Grid = field(default_factory=Grid)
    seed: int = 0
    load_at: LoadAt | None = None  # rate -> load; Poisson by default
    shortlist: int = 4  # families searched on the server (0: the prediction's first alone)
    predict_s: float = 6.0  # seconds of arrivals each prediction simulates

    def load(self, rate: float) -> Load:
        return self.load_at(rate) if self.load_at else poisson(rate, self.seed)


@dataclass
class Ranked:
    """One candidate, predicted."""

    config: BatcherConfig
    best: Prediction | None  # at the highest rate within the budget (None: no rate meets it)
    at_rate: Prediction | None = None  # with a target rate: the prediction there

    @property
    def rate(self) -> float:
        return self.best.rate if self.best else 0.0

    def feasible(self, request: TuneRequest) -> bool:
        """Predicted to meet the budget: at the target rate if there is one, else at some rate."""
        if request.rate:
            return self.at_rate is not None and self.at_rate.meets(request.budget_ms)
        return self.best is not None


@dataclass
class Point:
    """One configuration at one rate: predicted, and measured once the server has run it
    (``measured``: its last run; ``runs`` of them, ``verdict`` by the search's rule)."""

    config: BatcherConfig
    rate: float
    predicted: Prediction
    measured: Measurement | None = None
    runs: int = 0
    verdict: Verdict | None = None
    p99s: tuple[float, ...] = ()  # every run's p99, in the order measured
    mets: tuple[bool, ...] = ()  # ... and whether it met the budget


@dataclass
class Candidate:
    """A configuration searched on the server, and the points its search measured."""

    config: BatcherConfig
    predicted_rate: float
    points: list[Point]
    seconds: float


@dataclass
class TuneResult:
    request: TuneRequest
    probe: ProbeResult
    ranking: list[Ranked]
    shortlist: list[Candidate]
    chosen: BatcherConfig
    operating_rate: float  # the answer's rate: the target, or the highest rate it held the budget at
    evidence: Evidence[BatcherConfig]
    points: list[Point] = field(default_factory=list)  # the answer's verification and its neighbours'
    demoted: list[Point] = field(default_factory=list)  # answers a later run refuted, each at its rate
    predict_s: float = 0.0
    shortlist_s: float = 0.0
    verify_s: float = 0.0

    @property
    def measured_rate(self) -> float:
        """The highest rate the answer held the budget at, by the search's rule."""
        return self.evidence.held_rate(self.chosen)

    @property
    def operating_point(self) -> Point:
        return next(p for p in self.points if p.config == self.chosen and p.rate == self.operating_rate)


def compute_ms(result: ProbeResult) -> Callable[[int], float]:
    """The probe's compute per batch size, the slowest of the instance counts' fits (instances that
    share the cores each take longer per batch)."""
    return lambda batch: max(fit.batch_ms(batch) for fit in result.fits.values())


def rank(result: ProbeResult, request: TuneRequest) -> list[Ranked]:
    """Every candidate with its prediction, best first: feasible ones, then by predicted rate (ties:
    less delay, fewer instances, smaller batches). No candidate's full batch computes for longer than
    the budget (``Grid.batch_sizes``): such a batch misses it whatever the simulation says."""
    ranked = []
    for config in request.grid.candidates(request.budget_ms, compute_ms(result)):
        service = result.services[config.instances]
        best = max_rate(config, service, request.budget_ms, request.load, request.predict_s)
        at_rate = (
            predict(config, service, request.load(request.rate), request.predict_s) if request.rate else None
        )
        ranked.append(Ranked(config, best, at_rate))

    def key(entry: Ranked) -> tuple:
        c = entry.config
        return (not entry.feasible(request), -entry.rate, c.max_queue_delay_us, c.instances, c.max_batch_size)

    return sorted(ranked, key=key)


def shortlist(ranking: list[Ranked], request: TuneRequest) -> list[Ranked]:
    """The best predicted feasible candidate of each family (instance count, max batch size), best
    first, at most ``request.shortlist``. Every family is a candidate for measurement however far below
    the top its prediction lies: a fit of ``T + (N-1)·Δt`` to a cost that is not linear in the batch is
    off by family, and a family the prediction put 30% under the top sustained the most (the tests'
    simulated server with a compute that stops growing beyond 8 samples). Where none is predicted to
    meet a target rate, those predicted to meet the budget at some rate: the shortlist measures at the
    target all the same."""
    feasible = [e for e in ranking if e.feasible(request)] or [e for e in ranking if e.best is not None]
    families: dict[tuple[int, int], Ranked] = {}
    for entry in feasible:
        families.setdefault((entry.config.instances, entry.config.max_batch_size), entry)
    return list(families.values())[: request.shortlist]


def point_of(
    result: ProbeResult, request: TuneRequest, evidence: Evidence[BatcherConfig], config: BatcherConfig,
    rate: float,
) -> Point:  # fmt: skip
    """``config`` at ``rate`` predicted, with what ``evidence`` holds of it."""
    service = result.services.get(config.instances) or next(iter(result.services.values()))
    point = Point(config, rate, predict(config, service, request.load(rate), request.predict_s))
    if runs := evidence.of(config, rate):
        point.measured, point.runs, point.verdict = runs[-1], len(runs), evidence.verdict(config, rate)
        point.p99s = tuple(run.p99_ms for run in runs)
        point.mets = tuple(run.meets(request.budget_ms) for run in runs)
    return point


def search_candidate(
    server: Server, result: ProbeResult, request: TuneRequest, evidence: Evidence[BatcherConfig],
    config: BatcherConfig, predicted: float, start: float, step: Step,
) -> Candidate:  # fmt: skip
    """``config`` searched on the server from ``start`` (with a target rate: from it)."""
    started = time.perf_counter()
    server.prepare(config)
    rates = search(
        server, evidence, config, request.load, start, target=request.rate,
        label=f"search {config.label}", step=step,
    )  # fmt: skip
    points = [point_of(result, request, evidence, config, rate) for rate in rates]
    return Candidate(config, predicted, points, time.perf_counter() - started)


def verify(
    server: Server, result: ProbeResult, request: TuneRequest, evidence: Evidence[BatcherConfig],
    chosen: BatcherConfig, operating: float,
) -> list[Point]:  # fmt: skip
    """The answer at ``operating`` and at ``VERIFY_RUNGS`` of its measured rate, its neighbours at
    ``NEIGHBOUR_RUNGS``: predicted, and measured once where no run was made there yet (a point the
    search decided is not measured again). One configuration after the other. The answer's own points
    at or below its rate that are left open (a verification run that missed, a probe run's) are then
    decided by the rule: a miss there that stands refutes the answer (``Evidence.refuted_at``)."""
    base = math.floor(rung(evidence.held_rate(chosen)) + 1e-9)
    plan = [(chosen, rate) for rate in sorted({operating, *(at_rung(base + k) for k in VERIFY_RUNGS)})]
    for config in neighbours(chosen, request.grid):
        plan += [(config, at_rung(base + k)) for k in NEIGHBOUR_RUNGS]
    for config, rate in plan:
        if not evidence.of(config, rate):
            server.prepare(config)
            run = server.measure(request.load(rate), f"verify {config.label} @ {rate:,.0f}/s")
            evidence.add(config, rate, run)
    if opened := evidence.open_below(chosen, operating):
        server.prepare(chosen)
        for rate in opened:
            decide(server, evidence, chosen, rate, request.load, f"verify {chosen.label}")
    return [point_of(result, request, evidence, config, rate) for config, rate in plan]


def settle(
    server: Server, result: ProbeResult, request: TuneRequest, evidence: Evidence[BatcherConfig],
    searched: dict[BatcherConfig, Candidate], order: Sequence[BatcherConfig], step: Step,
    recheck: Recheck | None = None, detail: str = "",
) -> tuple[BatcherConfig, float, list[Point], list[Point]]:  # fmt: skip
    """The answer (the module docstring, 4): its configuration, its rate, its verification points and the
    answers a later run refuted. Raises ``NothingMeetsError`` (with ``detail``) where no point holds."""
    demoted: list[Point] = []
    answers: list[BatcherConfig] = []
    for _ in range(SETTLE_ROUNDS):
        found = evidence.best(at=request.rate, prefer=[*answers, *order])
        if found is None:
            raise evidence.nothing_meets(attrgetter("label"), detail, request.rate or 0.0)
        config, rate = found
        if config not in searched:  # a probe run's or a neighbour's configuration: searched before it stands
            step(f"searching {config.label}: a run held the budget at {rate:,.0f}/s")
            start = request.rate or evidence.held_rate(config)
            searched[config] = search_candidate(server, result, request, evidence, config, 0.0, start, step)
            continue
        answers.insert(0, config)
        step(f"verifying {config.label} around {rate:,.0f}/s, and its neighbours")
        points = verify(server, result, request, evidence, config, rate)
        if evidence.best(at=request.rate, prefer=answers) != found:
            if (refuted := evidence.refuted_at(config)) <= rate:  # a miss below it stood
                demoted.append(point_of(result, request, evidence, config, refuted))
                step(f"{config.label} missed the budget at {refuted:,.0f}/s, below {rate:,.0f}/s: reopened")
            continue  # else a verification run held it further up: the answer moved
        if recheck is not None:
            recheck(config, rate, evidence)
            # the points with the runs it added
            points = [point_of(result, request, evidence, p.config, p.rate) for p in points]
        if evidence.verdict(config, rate) is Verdict.HOLDS:
            return config, rate, points, demoted
        demoted.append(point_of(result, request, evidence, config, rate))
        step(f"{config.label} at {rate:,.0f}/s: a later run missed the budget there; the answer is reopened")
    raise StudyError(f"the answer did not settle in {SETTLE_ROUNDS} rounds of search and verification")


def to_search(
    ranking: list[Ranked], request: TuneRequest, evidence: Evidence[BatcherConfig]
) -> list[tuple[BatcherConfig, float, float]]:
    """What the shortlist searches: (configuration, predicted rate, first rate). The shortlist (with
    none, the prediction's first), or, where no candidate is predicted within the budget, the
    configurations a probe run held it with (none held: the one whose run came closest, measured
    again from there: a single miss is no verdict)."""
    predicted = shortlist(ranking, request) or [e for e in ranking[:1] if e.best is not None]
    if predicted:
        return [(e.config, e.rate, request.rate or e.rate) for e in predicted]
    found = evidence.worth_searching(count=max(request.shortlist, 1))
    return [(config, 0.0, request.rate or rate) for config, rate in found]


def why_none(result: ProbeResult, request: TuneRequest, ranking: list[Ranked]) -> str:
    """Why the prediction proposes nothing to search (the verdict's detail)."""
    compute, grid = compute_ms(result), request.grid
    if not ranking:
        return (
            f"no candidate: even a batch of 2 computes for longer than the {request.budget_ms:g} ms budget "
            f"({compute(2):.0f} ms measured) and the grid has no unbatched candidate; raise the budget or "
            "serve without batching"
        )
    first_config, first = result.runs[0]
    busy = 100 * (result.cpu.utilization(0, 0) if result.cpu else 0)
    one = result.fits[grid.instances[0]].t_ms  # a fit's T can come out negative: no figure then
    return (
        f"no candidate is predicted to meet p99 <= {request.budget_ms:g} ms at any rate, and no point "
        f"measured held it: the probe's first run ({first_config.label}, {first.load.rate:.0f}/s) "
        f"measured p99 {first.p99_ms:.1f} ms already; a batch of one: {number(one, 2, unit=' ms')} "
        f"computing, {number(result.overhead_ms, 2, unit=' ms')} outside the server; the machine's cores "
        f"were {busy:.0f}% busy without this load"
    )


def tune(
    server: Server, request: TuneRequest, plan: ProbePlan | None = None, step: Step | None = None,
    recheck: Recheck | None = None,
) -> TuneResult:  # fmt: skip
    """The whole tuner on ``server``; ``NothingMeetsError`` where no point holds by the search's rule."""
    step = step or (lambda text: None)
    grid = request.grid
    evidence: Evidence[BatcherConfig] = Evidence(request.budget_ms)
    step("probing: compute per batch size, costs beyond it, the CPU term")
    probed = probe(server, grid.instances, grid.largest_batch, plan, request.budget_ms)
    if request.load_at is None:  # Poisson, as the probe's: its runs are points of the same load
        for config, run in probed.runs:
            evidence.add(config, run.load.rate, run)
    compute = compute_ms(probed)
    within = grid.batch_sizes(request.budget_ms, compute)
    if within != grid.max_batches:
        costs = ", ".join(f"{n}: {compute(n):.0f} ms" for n in grid.max_batches)
        step(
            f"max batch sizes {list(grid.max_batches)} bounded to {list(within)}: a full batch must "
            f"compute within the {request.budget_ms:g} ms budget (measured: {costs})"
        )
    count = len(grid.candidates(request.budget_ms, compute))
    step(f"predicting {count} candidates (batcher simulation)")
    started = time.perf_counter()
    ranking = rank(probed, request)
    predict_s = time.perf_counter() - started
    entries = to_search(ranking, request, evidence)
    unpredicted = not ranking or ranking[0].best is None
    detail = why_none(probed, request, ranking) if unpredicted else ""
    if not entries:
        raise evidence.nothing_meets(attrgetter("label"), detail, request.rate or 0.0)
    if unpredicted:
        step("no candidate is predicted within the budget; searching what the probe measured closest to it")
    started = time.perf_counter()
    searched: dict[BatcherConfig, Candidate] = {}
    for config, predicted, start in entries:
        step(f"shortlist: {config.label} from {start:,.0f}/s")
        searched[config] = search_candidate(server, probed, request, evidence, config, predicted, start, step)
    shortlist_s = time.perf_counter() - started
    started = time.perf_counter()
    order = [config for config, _, _ in entries] + [r.config for r in ranking]
    chosen, operating, points, demoted = settle(
        server, probed, request, evidence, searched, order, step, recheck, detail
    )
    return TuneResult(
        request, probed, ranking, list(searched.values()), chosen, operating, evidence, points=points,
        demoted=demoted, predict_s=predict_s, shortlist_s=shortlist_s, verify_s=time.perf_counter() - started,
    )  # fmt: skip
