"""The tuner's steps around the one measured search (``perf.session.search``, tested on its own in
``tests/unit/perf/session/test_search.py``): which candidates the shortlist searches, and the
verification's points."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from perf.measure.loads import Load, poisson
from perf.model.batcher import BatcherConfig, ServiceModel
from perf.model.grid import Grid
from perf.model.predict import Prediction
from perf.session.probe import ProbeResult
from perf.session.search import Evidence, Verdict, at_rung
from perf.tune.tuner import Ranked, TuneRequest, shortlist, verify

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


class Holding:
    """Holds the budget at every rate (p99 5 ms); every run's configuration and rate in ``runs``."""

    cores = 2

    def __init__(self) -> None:
        self.current: BatcherConfig | None = None
        self.runs: list[tuple[BatcherConfig, float]] = []

    def prepare(self, config: BatcherConfig) -> None:
        self.current = config

    def measure(self, load: Load, label: str) -> SimpleNamespace:
        assert self.current is not None
        self.runs.append((self.current, load.rate))
        return SimpleNamespace(
            label=label, p99_ms=5.0, throughput=load.rate, sustained=True, failed=0, meets=lambda b: True
        )


def test_the_verification_measures_the_answer_around_its_rate_and_its_neighbours_once() -> None:
    grid = Grid(delays_us=(0, 1000, 2000), max_batches=(8,), instances=(2,))
    server, evidence = Holding(), Evidence(10.0)
    answer = at_rung(60)  # the rate the search measured the answer to hold the budget at
    server.prepare(X2_8)
    evidence.add(X2_8, answer, server.measure(poisson(answer, 0), "search"))
    points = verify(server, PROBED, TuneRequest(10.0, grid=grid), evidence, X2_8, answer)
    pick_rates = [p.rate for p in points if p.config == X2_8]
    assert pick_rates == pytest.approx([at_rung(54), at_rung(57), answer, at_rung(61)])  # 50, 71, 100, 112%
    others = {(p.config.max_queue_delay_us, p.rate) for p in points if p.config != X2_8}
    assert others == {(0, at_rung(57)), (0, answer), (2000, at_rung(57)), (2000, answer)}
    assert all(p.measured and p.predicted.rate == p.rate and p.verdict is Verdict.HOLDS for p in points)
    # each measured on its own configuration, and the answer's own point not again
    assert server.runs.count((X2_8, answer)) == 1 and len(server.runs) == len(points)
