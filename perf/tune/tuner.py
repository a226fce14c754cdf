"""The tuner, as a pipeline: probe → predict every candidate → measure a shortlist around its
predictions → pick → verify, demoting a pick the verification does not confirm.

1. ``probe``: the service model per instance count, measured (``perf.session.probe``).
2. ``rank``: every candidate of the grid predicted by the batcher simulation: the highest rate its p99
   stays within the budget (with a target rate: whether it does there).
3. ``shortlist`` and ``search_rate``: the best predicted of each family (instance count, max batch
   size) measured in a few runs around its prediction: up after a run that met the budget, down after
   one that missed, then between the two. With no shortlist, the prediction's first is searched so.
4. ``contenders``: the candidates measured to sustain something within the budget (with a target
   rate, at least that), the most sustained first; ``pick`` is the first of them.
5. ``settle``: each contender in turn measured at its operating rate (the target, or
   ``OPERATING_SHARE`` of what it sustained; without a target, lower rates after a miss, twice). The
   first that meets the budget is the answer; one that misses at every rate tried, by however little,
   is demoted and the next takes its place. None left: ``NothingMeetsError``,
   naming the closest figure measured. The answer is a configuration and a rate a run met the budget at.
6. ``verify``: the answer around its operating rate, and its neighbours one delay step either side,
   each predicted and measured (the report's comparison; the answer is settled already).

Every run goes through the ``Server`` handed in, which owns how a run is measured (load engine,
windows, the host-noise policy); the search only asks "this configuration at this rate".
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from perf.errors import NothingMeetsError
from perf.measure.loads import Load, poisson
from perf.measure.measurement import Measurement
from perf.model.batcher import BatcherConfig
from perf.model.grid import Grid, neighbours
from perf.model.predict import LoadAt, Prediction, max_rate, predict
from perf.session.probe import ProbePlan, ProbeResult, Server, probe

log = logging.getLogger(__name__)
Step = Callable[[str], None]
OPERATING_SHARE = 0.85  # of the rate the pick was measured to sustain: where it is verified and run
VERIFY_RATES, VERIFY_STEP_DOWN = 3, 0.7  # a verification that misses is tried again lower, twice


@dataclass(frozen=True)
class TuneRequest:
    budget_ms: float
    rate: float | None = None  # None: the highest rate within the budget
    grid: Grid = field(default_factory=Grid)
    seed: int = 0
    load_at: LoadAt | None = None  # rate -> load; Poisson by default
    shortlist: int = 4  # families measured before the pick (0: the prediction alone picks)
    search_points: int = 3  # runs per shortlisted candidate
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
    """One configuration at one rate: predicted, and measured once the server has run it."""

    config: BatcherConfig
    rate: float
    predicted: Prediction
    measured: Measurement | None = None


@dataclass
class Candidate:
    """A shortlisted candidate and the runs that searched its sustainable rate."""

    config: BatcherConfig
    predicted_rate: float
    points: list[Point]
    seconds: float
    budget_ms: float

    @property
    def rate(self) -> float:
        """The highest rate measured within the budget (0: none was)."""
        met = [p.rate for p in self.points if p.measured and p.measured.meets(self.budget_ms)]
        return max(met, default=0.0)


@dataclass
class TuneResult:
    request: TuneRequest
    probe: ProbeResult
    ranking: list[Ranked]
    shortlist: list[Candidate]
    chosen: BatcherConfig
    operating_rate: float
    points: list[Point] = field(default_factory=list)  # the verification, demoted picks' runs first
    demoted: list[Point] = field(default_factory=list)  # each demoted pick at its operating rate, a miss
    predict_s: float = 0.0
    shortlist_s: float = 0.0
    verify_s: float = 0.0

    @property
    def tuner_s(self) -> float:
        """What the pick cost: probe, prediction and shortlist (not the verification)."""
        return self.probe.seconds + self.predict_s + self.shortlist_s

    def points_of(self, config: BatcherConfig) -> list[Point]:
        return sorted((p for p in self.points if p.config == config), key=lambda p: p.rate)

    @property
    def measured_rate(self) -> float:
        """The highest verified rate of the pick within the budget (0: none)."""
        budget = self.request.budget_ms
        met = [p.rate for p in self.points_of(self.chosen) if p.measured and p.measured.meets(budget)]
        return max(met, default=0.0)

    @property
    def operating_point(self) -> Point:
        return min(self.points_of(self.chosen), key=lambda p: abs(p.rate - self.operating_rate))


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


def predict_point(result: ProbeResult, request: TuneRequest, config: BatcherConfig, rate: float) -> Point:
    service = result.services[config.instances]
    return Point(config, rate, predict(config, service, request.load(rate), request.predict_s))


def measure_point(server: Server, request: TuneRequest, point: Point, purpose: str) -> Point:
    """``point`` measured on the configuration loaded now, on the load its prediction used."""
    point.measured = server.measure(
        request.load(point.rate), f"{purpose} {point.config.label} @ {point.rate:.0f}/s"
    )
    log.info(
        "%s: predicted p99 %.1f ms, measured %.1f ms (%.0f/s served)",
        point.measured.label,
        point.predicted.p99_ms,
        point.measured.p99_ms,
        point.measured.throughput,
    )
    return point


def search_rate(server: Server, result: ProbeResult, request: TuneRequest, entry: Ranked) -> Candidate:
    """``entry`` measured around its prediction (with a target rate: from it): ``request.search_points``
    runs, ×1.25 after one that met the budget and ×0.7 after one that missed, then the geometric middle
    of the highest met and the lowest missed. With a target rate, a miss at the target ends it."""
    started = time.perf_counter()
    server.prepare(entry.config)
    budget = request.budget_ms
    rate, passed, missed = request.rate or entry.rate, 0.0, math.inf
    points = []
    for _ in range(request.search_points):
        point = measure_point(
            server, request, predict_point(result, request, entry.config, rate), "shortlist"
        )
        points.append(point)
        met = point.measured is not None and point.measured.meets(budget)
        passed, missed = (max(passed, rate), missed) if met else (passed, min(missed, rate))
        if request.rate and not passed:
            break
        rate = math.sqrt(passed * missed) if passed and missed < math.inf else rate * (1.25 if met else 0.7)
    return Candidate(entry.config, entry.rate, points, time.perf_counter() - started, budget)


def contenders(measured: list[Candidate], request: TuneRequest) -> list[Candidate]:
    """The measured candidates that met the budget at some rate (with a target rate: at least there),
    the most sustained first; ties keep the prediction's order."""
    sustaining = [c for c in measured if c.rate > 0 and c.rate >= (request.rate or 0.0)]
    return sorted(sustaining, key=lambda c: -c.rate)


def pick(measured: list[Candidate], ranking: list[Ranked], request: TuneRequest) -> BatcherConfig:
    """The candidate measured to sustain the most (with a target rate, only one that sustained it);
    ties go to the prediction's order. None did, or none was measured: the prediction's first (which
    ``settle`` then holds to a measurement like any other)."""
    found = contenders(measured, request)
    return found[0].config if found else ranking[0].config


def operating_rate(candidate: Candidate, request: TuneRequest) -> float:
    """Where a contender is verified and would run: the target, or ``OPERATING_SHARE`` of its measured
    sustained rate."""
    return request.rate or OPERATING_SHARE * candidate.rate


def verify_rates(candidate: Candidate, request: TuneRequest) -> list[float]:
    """The rates a contender is verified at, in turn, until one meets the budget: its operating rate,
    then ``VERIFY_STEP_DOWN`` of it, twice (a host slower than during the shortlist still gets a
    measured answer). With a target rate, the target alone."""
    rate = operating_rate(candidate, request)
    return [rate] if request.rate else [rate * VERIFY_STEP_DOWN**k for k in range(VERIFY_RATES)]


def settle(
    server: Server, result: ProbeResult, request: TuneRequest, measured: list[Candidate], step: Step
) -> tuple[Candidate, Point, list[Point], list[Point]]:
    """The answer: the first of the ``contenders`` among ``measured`` with a run within the budget at
    one of its ``verify_rates``, that run, the demoted ones' runs at their operating rate (each a miss
    there, however small: 50.2 ms is not within 50 ms), and the misses at lower rates. Raises
    ``NothingMeetsError`` when every contender is demoted (or there was none), naming the closest
    figure of every run the search and the verification made."""
    demoted: list[Point] = []
    stepped: list[Point] = []
    for candidate in contenders(measured, request):
        server.prepare(candidate.config)
        misses = []
        for rate in verify_rates(candidate, request):
            step(f"verifying {candidate.config.label} at {rate:.0f}/s")
            point = measure_point(
                server, request, predict_point(result, request, candidate.config, rate), "verify"
            )
            assert point.measured is not None
            if point.measured.meets(request.budget_ms):
                return candidate, point, demoted, stepped + misses
            step(
                f"{candidate.config.label} missed the budget at {rate:.0f}/s (p99 "
                f"{point.measured.p99_ms:.1f} ms, served {point.measured.throughput:.0f}/s)"
            )
            misses.append(point)
        step(f"{candidate.config.label}: demoted")
        demoted.append(misses[0])
        stepped.extend(misses[1:])
    raise nothing_meets(request, result, [p for c in measured for p in c.points] + demoted + stepped)


def nothing_meets(
    request: TuneRequest, result: ProbeResult, points: Sequence[Point], detail: str = ""
) -> NothingMeetsError:
    """The one-line verdict with the closest figure measured: the lowest p99 among ``points`` (with a
    target rate, among those run at it, where any were), else among the probe's runs. A closest run
    that met the budget is no answer all the same, and the line says why."""
    runs = [(p.config, p.rate, p.measured) for p in points if p.measured is not None]
    if request.rate and any(rate >= request.rate for _, rate, _ in runs):
        runs = [run for run in runs if run[1] >= request.rate]
    runs = runs or [(config, run.load.rate, run) for config, run in result.runs]
    if not runs:
        return NothingMeetsError(
            f"nothing meets p99 <= {request.budget_ms:g} ms here: nothing was measured", detail
        )
    config, rate, run = min(runs, key=lambda r: r[2].p99_ms if math.isfinite(r[2].p99_ms) else math.inf)
    behind = None if run.sustained else run.throughput
    note = ""
    if run.meets(request.budget_ms):
        note = (
            "a search run met the budget there; the verification at the operating rate missed it"
            if points
            else "a probe run; no candidate is predicted within the budget at any rate"
        )
    return NothingMeetsError.closest(request.budget_ms, config.label, rate, run.p99_ms, behind, detail, note)


def verify(
    server: Server,
    result: ProbeResult,
    request: TuneRequest,
    chosen: BatcherConfig,
    operating: float,
    reference: float,
    fractions: tuple[float, ...] = (0.5, 0.75, 1.0, 1.15),
    neighbour_fractions: tuple[float, ...] = (0.75, 1.0),
    done: Sequence[Point] = (),
) -> list[Point]:
    """The pick at ``operating`` and at ``fractions`` of ``reference``, its neighbours at
    ``neighbour_fractions``: predicted, then measured, one configuration after the other. A point of
    ``done`` (the operating run ``settle`` measured) takes its place in the plan, not measured again."""
    plan = [(chosen, rate) for rate in sorted({operating, *(f * reference for f in fractions)})]
    for config in neighbours(chosen, request.grid):
        plan += [(config, f * reference) for f in neighbour_fractions]
    taken = {(p.config, p.rate): p for p in done}
    points = []
    for config, rate in plan:
        if (config, rate) in taken:
            points.append(taken.pop((config, rate)))
            continue
        server.prepare(config)
        points.append(measure_point(server, request, predict_point(result, request, config, rate), "verify"))
    return points


def tune(
    server: Server, request: TuneRequest, plan: ProbePlan | None = None, step: Step | None = None
) -> TuneResult:
    """The whole tuner on ``server`` (a started ``ModelSession``, or a simulated server). Raises
    ``NothingMeetsError`` where nothing measured meets the budget."""
    step = step or (lambda text: None)
    grid = request.grid
    step("probing: compute per batch size, costs beyond it, the CPU term")
    probed = probe(server, grid.instances, grid.largest_batch, plan)
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
    if not ranking:  # what was measured rules every candidate out: the honest answer, not an error
        raise nothing_meets(
            request,
            probed,
            [],
            f"no candidate: even a batch of 2 computes for longer than the {request.budget_ms:g} ms budget "
            f"({compute(2):.0f} ms measured) and the grid has no unbatched candidate; raise the budget or "
            "serve without batching",
        )
    if ranking[0].best is None:
        first_config, first = probed.runs[0]
        raise nothing_meets(
            request,
            probed,
            [],
            f"no candidate is predicted to meet p99 <= {request.budget_ms:g} ms at any rate: the probe's "
            f"first run ({first_config.label}, {first.load.rate:.0f}/s) measured p99 {first.p99_ms:.1f} ms "
            f"already; a batch of one takes {probed.fits[grid.instances[0]].t_ms:.2f} ms plus "
            f"{probed.overhead_ms:.2f} ms outside the server, and the machine's cores were "
            f"{100 * (probed.cpu.utilization(0, 0) if probed.cpu else 0):.0f}% busy without this load",
        )
    started = time.perf_counter()
    measured = []
    # With no shortlist the prediction's first is still searched on the server: the answer is measured.
    for entry in shortlist(ranking, request) or ranking[:1]:
        step(f"shortlist: {entry.config.label} around {request.rate or entry.rate:.0f}/s")
        measured.append(search_rate(server, probed, request, entry))
    shortlist_s = time.perf_counter() - started
    started = time.perf_counter()
    answer, operating_point, demoted, stepped = settle(server, probed, request, measured, step)
    chosen, operating = answer.config, operating_point.rate
    step(f"verifying {chosen.label} around {operating:.0f}/s, and its neighbours")
    points = verify(server, probed, request, chosen, operating, answer.rate, done=[operating_point])
    return TuneResult(
        request, probed, ranking, measured, chosen, operating, points=demoted + stepped + points,
        demoted=demoted, predict_s=predict_s, shortlist_s=shortlist_s, verify_s=time.perf_counter() - started,
    )  # fmt: skip
