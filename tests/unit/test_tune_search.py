"""The tuner's search, step by step against a scripted server (each configuration meets the budget up
to a known rate): which candidates the shortlist measures, the rates it measures them at, the pick,
and the verification's points."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from perf.measure.loads import Load
from perf.model.batcher import BatcherConfig, ServiceModel
from perf.model.grid import Grid
from perf.model.predict import Prediction
from perf.session.probe import ProbeResult
from perf.tune.tuner import (
    Candidate,
    Point,
    Ranked,
    TuneRequest,
    pick,
    search_rate,
    shortlist,
    verify,
)

X1_8, X1_8_SLOW = BatcherConfig(8, 2000), BatcherConfig(8, 500)
X1_32, X2_8, X2_32 = (
    BatcherConfig(32, 2000),
    BatcherConfig(8, 1000, instances=2),
    BatcherConfig(32, 0, instances=2),
)
SERVICE = ServiceModel(0.001, 0.0001)
PROBED = ProbeResult({1: SERVICE, 2: SERVICE}, {}, 0.0, 0.0, {})


def ranked(config: BatcherConfig, rate: float | None, at_rate: bool | None = None) -> Ranked:
    best = Prediction(config, rate, 8.0, rate, 4.0, True) if rate else None
    there = (
        None if at_rate is None else Prediction(config, 1000.0, 8.0 if at_rate else 50.0, 1000.0, 4.0, True)
    )
    return Ranked(config, best, there)


class ScriptedServer:
    """Meets the budget up to ``capacity[config]`` requests/s; every run kept in ``runs``."""

    cores = 2

    def __init__(self, capacity: dict[BatcherConfig, float]) -> None:
        self.capacity = capacity
        self.current: BatcherConfig | None = None
        self.runs: list[tuple[BatcherConfig, float]] = []

    def prepare(self, config: BatcherConfig) -> None:
        self.current = config

    def measure(self, load: Load, label: str) -> SimpleNamespace:
        assert self.current is not None
        self.runs.append((self.current, load.rate))
        met = load.rate <= self.capacity[self.current]
        return SimpleNamespace(
            label=label, p99_ms=5.0 if met else 50.0, throughput=load.rate, meets=lambda _b: met
        )


def test_the_shortlist_takes_the_best_of_each_family_best_first() -> None:
    ranking = [ranked(X2_8, 2600), ranked(X1_8, 2500), ranked(X1_8_SLOW, 2450), ranked(X1_32, 2400)]
    ranking += [ranked(X2_32, 1900), ranked(BatcherConfig(1, instances=2), 900)]
    # every family, however far below the top: X2_32 predicted at 73% of it is measured too
    assert [r.config for r in shortlist(ranking, TuneRequest(10.0, shortlist=4))] == [
        X2_8,
        X1_8,
        X1_32,
        X2_32,
    ]
    assert [r.config for r in shortlist(ranking, TuneRequest(10.0, shortlist=2))] == [X2_8, X1_8]
    assert shortlist(ranking, TuneRequest(10.0, shortlist=0)) == [] and shortlist([], TuneRequest(10.0)) == []


def test_with_a_target_rate_the_shortlist_keeps_those_predicted_to_meet_it_else_any_feasible() -> None:
    request = TuneRequest(10.0, rate=1000.0)
    ranking = [ranked(X2_8, 2600, at_rate=False), ranked(X1_8, 2500, at_rate=True)]
    assert [r.config for r in shortlist(ranking, request)] == [X1_8]
    nowhere = [
        ranked(X2_8, 2600, at_rate=False),
        ranked(X1_32, 2400, at_rate=False),
        ranked(X2_32, None, False),
    ]
    assert [r.config for r in shortlist(nowhere, request)] == [X2_8, X1_32]  # measured at the target anyway


def test_the_search_starts_at_the_prediction_goes_up_after_a_pass_down_after_a_miss_then_between() -> None:
    server = ScriptedServer({X1_8: 2300.0})
    found = search_rate(server, PROBED, TuneRequest(10.0, search_points=3), ranked(X1_8, 2000))
    rates = [rate for _, rate in server.runs]
    # 2000 met; ×1.25 = 2500 missed; then the geometric middle of 2000 and 2500
    assert rates == pytest.approx([2000, 2500, (2000 * 2500) ** 0.5])
    assert found.rate == pytest.approx((2000 * 2500) ** 0.5)  # a rate a run met the budget at, never a guess
    server = ScriptedServer({X1_8: 1000.0})
    found = search_rate(server, PROBED, TuneRequest(10.0, search_points=3), ranked(X1_8, 2000))
    assert [rate for _, rate in server.runs] == pytest.approx([2000, 1400, 980])  # ×0.7 while it misses
    assert found.rate == pytest.approx(980) and found.predicted_rate == 2000
    nothing = search_rate(ScriptedServer({X1_8: 10.0}), PROBED, TuneRequest(10.0), ranked(X1_8, 2000))
    assert nothing.rate == 0.0


def test_with_a_target_rate_the_search_starts_there_and_a_miss_there_ends_it() -> None:
    request = TuneRequest(10.0, rate=1500.0, search_points=3)
    server = ScriptedServer({X1_8: 1000.0, X2_8: 5000.0})
    assert search_rate(server, PROBED, request, ranked(X1_8, 2000)).rate == 0.0
    assert server.runs == [(X1_8, 1500.0)]
    assert search_rate(server, PROBED, request, ranked(X2_8, 2000)).rate == pytest.approx(1500 * 1.25**2)


def candidate(config: BatcherConfig, rate: float) -> Candidate:
    met = SimpleNamespace(meets=lambda _b: True)
    return Candidate(config, 0.0, [Point(config, rate, None, met)] if rate else [], 1.0, 10.0)


def test_the_pick_is_the_most_sustained_and_a_target_rate_must_be_sustained() -> None:
    ranking = [ranked(X2_8, 2600), ranked(X1_32, 2400), ranked(X2_32, 1900)]
    measured = [candidate(X2_8, 1800), candidate(X1_32, 2100), candidate(X2_32, 2100)]
    assert pick(measured, ranking, TuneRequest(10.0)) == X1_32  # the most sustained; a tie: the model's order
    assert (
        pick(measured, ranking, TuneRequest(10.0, rate=2200.0)) == X2_8
    )  # none sustained it: the model's first
    assert pick([candidate(X2_8, 0.0)], ranking, TuneRequest(10.0)) == X2_8
    assert pick([], ranking, TuneRequest(10.0)) == X2_8


def test_the_verification_measures_the_pick_around_its_rate_and_its_neighbours() -> None:
    grid = Grid(delays_us=(0, 1000, 2000), max_batches=(8,), instances=(2,))
    server = ScriptedServer(
        {X2_8: 1e9, BatcherConfig(8, 0, instances=2): 1e9, BatcherConfig(8, 2000, instances=2): 1e9}
    )
    points = verify(server, PROBED, TuneRequest(10.0, grid=grid), X2_8, 850.0, 1000.0)
    pick_rates = [p.rate for p in points if p.config == X2_8]
    assert pick_rates == pytest.approx([500, 750, 850, 1000, 1150])  # the operating rate among them
    others = {(p.config.max_queue_delay_us, round(p.rate)) for p in points if p.config != X2_8}
    assert others == {(0, 750), (0, 1000), (2000, 750), (2000, 1000)}
    assert all(p.measured and p.predicted.rate == p.rate for p in points)
    assert [c for c, _ in server.runs] == [p.config for p in points]  # each measured on its own config
