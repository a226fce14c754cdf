"""The one measured search (``perf.session.search``): its rule for a point's runs, the search on the rate
ladder, and what ``make tune`` and ``make plan`` answer with it. Against scripted servers: each holds the
budget up to a known rate, so what is asserted is what the tools must do with the runs they got."""

from __future__ import annotations

import contextlib
import math
from types import SimpleNamespace

import pytest

from perf.measure.loads import Load, poisson
from perf.model.batcher import BatcherConfig
from perf.model.grid import Grid
from perf.plan.planner import PlanRequest, plan
from perf.plan.strategy import Space
from perf.plan.topology import cpu_topology
from perf.plan.verify import measure_plan
from perf.session.probe import ProbePlan
from perf.session.search import (
    FAR_MISS,
    MAX_POINTS,
    Evidence,
    Verdict,
    at_rung,
    decide,
    on_ladder,
    rung,
    search,
    verdict,
)
from perf.tune.tuner import TuneRequest, tune
from tests.unit.perf.plan.test_placement import profile
from tests.unit.perf.scripted_server import ScriptedServer
from tests.unit.perf.tune.test_tuner import LINEAR

BUDGET_MS = 10.0


def run(p99_ms: float, served: float = 1000.0, met: bool | None = None) -> SimpleNamespace:
    ok = p99_ms <= BUDGET_MS if met is None else met
    return SimpleNamespace(
        label="run",
        p99_ms=p99_ms,
        throughput=served,
        sustained=True,
        samples=1000,
        too_few=False,
        failed=0,
        meets=lambda budget: ok,
    )


MET, NEAR, FAR = run(5.0), run(10.5), run(FAR_MISS * BUDGET_MS + 1)


@pytest.mark.parametrize(
    ("runs", "expected"),
    [
        ([MET], Verdict.HOLDS),  # a run that met shows it holds: noise never takes latency away
        ([NEAR], Verdict.OPEN),  # one miss alone decides nothing
        ([NEAR, NEAR], Verdict.MISSES),  # a miss confirmed by a second
        ([FAR], Verdict.MISSES),  # a miss by far needs no second run
        ([run(5.0, served=500.0, met=False)], Verdict.MISSES),  # fell far behind the offered 1,000/s
        ([NEAR, MET], Verdict.OPEN),  # as many met as missed: one run more
        ([NEAR, MET, MET], Verdict.HOLDS),  # a single noisy miss does not demote
        ([NEAR, MET, NEAR], Verdict.MISSES),
        ([MET, NEAR], Verdict.OPEN),  # a later run that misses reopens a point
        ([MET, FAR], Verdict.OPEN),
        ([MET, NEAR, NEAR], Verdict.MISSES),
        ([MET, MET, MET, NEAR], Verdict.HOLDS),
    ],
)
def test_the_rule_for_a_points_runs(runs: list, expected: Verdict) -> None:
    assert verdict(runs, 1000.0, BUDGET_MS) is expected


class Capacity:
    """Holds the budget up to ``capacity``/s (p99 5 ms), beyond it misses by far, serving ``capacity``;
    ``noisy``: rates whose first run misses by a little. Every run's rate kept in ``rates``."""

    def __init__(self, capacity: float, noisy: tuple[float, ...] = ()) -> None:
        self.capacity, self.noisy = capacity, list(noisy)
        self.rates: list[float] = []

    def measure(self, load: Load, label: str) -> SimpleNamespace:
        rate = load.rate
        self.rates.append(rate)
        if rate in self.noisy:
            self.noisy.remove(rate)
            return run(10.4, served=rate)
        return run(5.0, served=rate) if rate <= self.capacity else run(60.0, served=self.capacity)


def searched(server: Capacity, start: float, target: float | None = None) -> tuple[float, list[float]]:
    evidence: Evidence[str] = Evidence(BUDGET_MS)
    rates = search(server, evidence, "x", lambda rate: poisson(rate, 0), start, target=target)
    return evidence.held_rate("x"), rates


def highest_rung_within(capacity: float) -> float:
    return at_rung(math.floor(rung(capacity)))


@pytest.mark.parametrize("start", [150.0, 600.0, 1000.0, 2500.0, 20_000.0])
def test_the_search_finds_the_highest_rung_within_the_budget_from_any_start(start: float) -> None:
    server = Capacity(1000.0)
    held, rates = searched(server, start)
    assert held == pytest.approx(highest_rung_within(1000.0))  # the same answer, wherever it started
    assert rates[0] == on_ladder(start) and all(r == on_ladder(r) for r in rates)  # rungs only
    assert len(rates) <= MAX_POINTS
    above = [r for r in rates if r > held]
    assert above and min(above) == pytest.approx(at_rung(round(rung(held)) + 1))  # its neighbour missed


def test_after_a_far_miss_the_search_goes_to_what_the_server_served() -> None:
    server = Capacity(1000.0)
    searched(server, 50_000.0)
    assert server.rates[1] <= 0.8 * 1000.0  # not 0.7x of 50,000: from what the server answered


def test_a_single_noisy_miss_does_not_lower_the_answer() -> None:
    answer = highest_rung_within(1000.0)
    server = Capacity(1000.0, noisy=(answer,))
    held, _ = searched(server, 600.0)
    assert held == pytest.approx(answer)
    assert server.rates.count(answer) == 3  # the miss, the met run, the one that decided


def test_with_a_target_the_search_starts_there_and_a_miss_there_ends_it() -> None:
    server = Capacity(1000.0)
    held, rates = searched(server, 0.0, target=1500.0)
    assert held == 0.0 and rates == [1500.0] and server.rates == [1500.0]  # a far miss: no second run
    held, rates = searched(Capacity(1000.0), 0.0, target=700.0)
    assert rates[0] == 700.0 and held == pytest.approx(highest_rung_within(1000.0))


def test_evidence_answers_with_the_best_point_that_holds_and_names_the_closest_miss_over_the_budget() -> None:
    evidence: Evidence[str] = Evidence(BUDGET_MS)
    evidence.add("a", 800.0, MET)
    evidence.add("b", 900.0, NEAR)  # open: no answer
    evidence.add("b", 700.0, MET)
    assert evidence.best() == ("a", 800.0) and evidence.best(prefer=["b"]) == ("a", 800.0)
    evidence.add("b", 800.0, MET)
    assert evidence.best(prefer=["b"]) == ("b", 800.0)  # a tie goes to the preferred
    nothing: Evidence[str] = Evidence(BUDGET_MS)
    nothing.add("a", 100.0, run(9.0, served=40.0, met=False))  # behind, p99 within the budget
    nothing.add("a", 200.0, run(30.0, served=200.0))
    nothing.add("a", 200.0, run(25.0, served=200.0))
    assert nothing.best() is None
    text = str(nothing.nothing_meets(lambda key: key))
    assert text == (
        "nothing meets p99 <= 10 ms here: the closest measured was a at 200/s with p99 25.0 ms, 15.0 ms over "
        "the budget"
    )


def test_a_miss_that_stands_below_a_point_that_held_caps_what_the_configuration_holds_up_to() -> None:
    """A configuration holds the budget "up to" a rate only where no point below it misses: a miss alone
    there is open (to be decided), a miss that stands refutes every rate above it; a point that misses
    only on too few requests refutes nothing."""
    evidence: Evidence[str] = Evidence(BUDGET_MS)
    evidence.add("x", 1000.0, MET)
    evidence.add("x", 500.0, NEAR)
    assert evidence.held_rate("x") == 1000.0 and evidence.open_below("x", 1000.0) == [500.0]
    evidence.add("x", 500.0, NEAR)
    assert evidence.refuted_at("x") == 500.0 and evidence.held_rate("x") == 0.0
    assert evidence.best() is None and evidence.best(at=1000.0) is None
    evidence.add("x", 250.0, MET)
    assert evidence.held_rate("x") == 250.0 and evidence.best() == ("x", 250.0)
    few = run(5.0, met=False)
    few.too_few = True
    sparse: Evidence[str] = Evidence(BUDGET_MS)
    sparse.add("y", 1.0, few)
    sparse.add("y", 1.0, few)
    sparse.add("y", 3.0, MET)
    assert sparse.verdict("y", 1.0) is Verdict.MISSES and sparse.held_rate("y") == 3.0


def test_the_verdict_says_how_far_over_the_closest_run_was_and_names_failed_requests() -> None:
    """A run whose requests failed misses the budget whatever the p99 of those answered, and the verdict
    says it failed, not that it fell behind a rate it served; a run that fell behind says what it
    served; a run over the budget says by how much."""
    failing: Evidence[str] = Evidence(BUDGET_MS)
    broken = run(4.0, served=1000.0, met=False)
    broken.sustained, broken.failed = False, 12
    failing.add("a", 1000.0, broken)
    assert str(failing.nothing_meets(lambda key: key)) == (
        "nothing meets p99 <= 10 ms here: the closest measured was a at 1,000/s with p99 4.0 ms, "
        "12 requests failed"
    )
    silent: Evidence[str] = Evidence(BUDGET_MS)
    nothing = run(math.nan, served=0.0, met=False)
    nothing.sustained, nothing.failed = False, 50
    silent.add("a", 1000.0, nothing)  # zero throughput: every request failed
    assert silent.verdict("a", 1000.0) is Verdict.MISSES  # by far: no second run
    assert str(silent.nothing_meets(lambda key: key)) == (
        "nothing meets p99 <= 10 ms here: the closest measured was a at 1,000/s where no request was "
        "answered, 50 requests failed"
    )
    behind: Evidence[str] = Evidence(BUDGET_MS)
    slow = run(14.0, served=600.0, met=False)
    slow.sustained = False
    behind.add("a", 1000.0, slow)
    assert str(behind.nothing_meets(lambda key: key)) == (
        "nothing meets p99 <= 10 ms here: the closest measured was a at 1,000/s with p99 14.0 ms, 4.0 ms "
        "over the budget, serving only 600/s of it"
    )


def test_a_point_decided_already_is_not_measured_again() -> None:
    server = Capacity(1000.0)
    evidence: Evidence[str] = Evidence(BUDGET_MS)
    assert decide(server, evidence, "x", 500.0, lambda r: poisson(r, 0), "x") is Verdict.HOLDS
    assert decide(server, evidence, "x", 500.0, lambda r: poisson(r, 0), "x") is Verdict.HOLDS
    assert server.rates == [500.0]


# make tune and make plan, asked the same question of the same scripted server: X holds the budget up to
# 1,000/s, every other configuration (the probe's among them) up to 300/s.
X = BatcherConfig(32, 1000, instances=1)


def capacity(config: BatcherConfig) -> float:
    return 1000.0 if config == X else 300.0


def test_make_tune_and_make_plan_answer_the_same_measured_rate() -> None:
    tuned = tune(
        ScriptedServer(LINEAR, BUDGET_MS, capacity, seed=1),
        TuneRequest(BUDGET_MS, grid=Grid(delays_us=(1000,), max_batches=(32,), instances=(1,),
                                         no_batching=False), predict_s=2.0),
        ProbePlan(max_runs=4),
    )  # fmt: skip
    assert tuned.chosen == X

    planned = plan(profile(), cpu_topology(), PlanRequest(BUDGET_MS, space=Space((1,), (1000,), split=False)))
    server = ScriptedServer(LINEAR, BUDGET_MS, capacity, seed=2)

    def serve(strategy):
        config = BatcherConfig(strategy.max_batch, strategy.delay_us, instances=strategy.instances[0])
        return contextlib.nullcontext(server), config

    evidence: Evidence[str] = Evidence(BUDGET_MS)
    settled, rate = measure_plan(planned, evidence, 1, serve, lambda text: None)
    assert serve(settled.chosen.strategy)[1] == X
    assert rate == tuned.measured_rate == pytest.approx(highest_rung_within(1000.0))
