"""The tuner's shortlist: which candidates it measures, the bracketed search that measures them, and the
pick that follows the measurement."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from perf.tune.batcher_sim import BatcherConfig
from perf.tune.measured import (
    SweepEntry,
    below_the_brackets,
    measure_shortlist,
    measured_max_rate,
    rematch,
    shortlist,
)
from perf.tune.operating import CONFIRM_STEPS, OPERATING_SHARE, Confirmation, confirm
from perf.tune.predict import Prediction
from perf.tune.rules import majority_kept_up, verdict
from perf.tune.tuner import Ranked, TuneRequest, pick, sustained


def ranked(config: BatcherConfig, rate: float | None) -> Ranked:
    best = Prediction(config, rate, 8.0, rate, 4.0, True) if rate else None
    return Ranked(config, best)


X1_8, X1_8_SLOW = BatcherConfig(8, 2000), BatcherConfig(8, 500)
X1_32, X2_8, X2_32 = (
    BatcherConfig(32, 2000),
    BatcherConfig(8, 1000, instances=2),
    BatcherConfig(32, 0, instances=2),
)


def test_the_shortlist_takes_the_best_of_each_family_within_the_window() -> None:
    ranking = [ranked(X2_8, 2600), ranked(X1_8, 2500), ranked(X1_8_SLOW, 2450), ranked(X1_32, 2400)]
    ranking += [ranked(X2_32, 2000), ranked(BatcherConfig(1, instances=2), 900)]
    assert [r.config for r in shortlist(ranking, 4, baselines=0)] == [X2_8, X1_8, X1_32, X2_32]
    assert [r.config for r in shortlist(ranking, 2, baselines=0)] == [X2_8, X1_8]  # the cap: best first
    assert [r.config for r in shortlist(ranking, 4, 0.9, 0)] == [X2_8, X1_8, X1_32]  # 2000 < 0.9 × 2600
    assert shortlist(ranking, 0) == [] and shortlist([], 4) == []


def test_the_first_families_add_their_shortest_delay_where_the_model_preferred_a_longer_one() -> None:
    x2_8_none, x1_8_none = BatcherConfig(8, 0, instances=2), BatcherConfig(8, 0)
    ranking = [ranked(X2_8, 2600), ranked(X1_8, 2500), ranked(X1_8_SLOW, 2450), ranked(x2_8_none, 2420)]
    ranking += [ranked(X1_32, 2400), ranked(x1_8_none, 1500)]  # below the window: never measured
    listed = [r.config for r in shortlist(ranking, 4)]
    # the family bests first (the model's order), then the shortest delay within the window of the
    # first two families: 0 ms for (2, 8), 0.5 ms for (1, 8), since 0 ms is below 0.75 × 2600
    assert listed == [X2_8, X1_8, X1_32, x2_8_none, X1_8_SLOW]
    assert [r.config for r in shortlist(ranking, 4, baselines=1)] == [X2_8, X1_8, X1_32, x2_8_none]
    assert [r.config for r in shortlist(ranking[:1] + ranking[4:], 4)] == [X2_8, X1_32]  # no shorter delay


def test_the_pick_is_the_most_sustained_and_a_target_rate_must_be_sustained() -> None:
    ranking = [ranked(X2_8, 2600), ranked(X1_32, 2400), ranked(X2_32, 1900)]
    measured = [SweepEntry(X2_32, 3200, [], 20), SweepEntry(X2_8, 2500, [], 20), SweepEntry(X1_32, 0, [], 20)]
    assert pick(ranking, measured, TuneRequest(10.0)).config == X2_32
    assert pick(ranking, measured, TuneRequest(10.0, rate=3000)).config == X2_32
    assert pick(ranking, measured, TuneRequest(10.0, rate=3500)).config == X2_8  # none sustained it
    nothing = [SweepEntry(X2_32, 0, [], 20)]
    assert pick(ranking, nothing, TuneRequest(10.0)).config == X2_8  # the prediction's first
    assert pick(ranking, [], TuneRequest(10.0)).config == X2_8


class FakeServer:
    """A server that meets the budget up to ``capacity`` requests/s, except for ``misses`` first runs
    at a rate that it would meet (a neighbour's burst): the search's rules, without a server."""

    def __init__(
        self, capacity: float, misses: int = 0, serves: float | None = None, miss_p99: float = 15.0
    ) -> None:
        self.capacity, self.misses, self.rates, self.spans = capacity, misses, [], []
        self.serves = serves  # beyond capacity, the rate it serves (None: it keeps up, late)
        self.miss_p99 = miss_p99  # a miss's p99 (15: a near miss of the tests' 10 ms budget)

    def prepare(self, config: BatcherConfig) -> None:
        pass

    def open_loop(self, arrivals: np.ndarray, label: str) -> SimpleNamespace:
        rate = len(arrivals) / arrivals[-1]
        self.rates.append(rate)
        self.spans.append(float(arrivals[-1]))
        ok = rate <= self.capacity
        if ok and self.misses:
            self.misses, ok = self.misses - 1, False
        p99 = 5.0 if ok else self.miss_p99
        served = rate if self.serves is None or rate <= self.capacity else min(rate, self.serves)
        return SimpleNamespace(
            meets=lambda budget: ok,
            p99_ms=p99,
            throughput=served,
            offered=rate,
            failed=0,
            label=label,
            stolen_share=0.0,
        )


def test_the_bracketed_search_starts_at_the_prediction_and_never_assumes_its_floor() -> None:
    request = TuneRequest(10.0, seconds=20.0)
    server = FakeServer(capacity=1150.0)
    entry = measured_max_rate(server, request, X1_8, 1500.0, steps=3, first=1000.0, floor=600.0)
    assert abs(server.rates[0] - 1000) < 30  # the first point is the prediction (Poisson: ~1000/s)
    assert 1000 <= entry.rate <= 1150 and entry.rate >= 1100  # 1000, 1250 ✗, 1125 ✓, 1187 ✗
    assert len(entry.points) == 6  # every miss measured twice
    assert entry.passed_run is entry.points[3] and entry.point_s == 20.0  # the run that met 1125/s
    assert entry.rates == [1000.0, 1250.0, 1250.0, 1125.0, 1187.5, 1187.5]  # each run's offered rate
    slow = measured_max_rate(FakeServer(capacity=100.0), request, X1_8, 1500.0, 3, 1000.0, 600.0)
    assert slow.rate == 0.0  # nothing in the bracket met the budget: 0, not the floor


def test_a_disturbed_miss_is_measured_again_before_the_bracket_moves() -> None:
    request = TuneRequest(10.0, seconds=20.0)
    server = FakeServer(capacity=1150.0, misses=1)
    entry = measured_max_rate(server, request, X1_8, 1500.0, steps=3, first=1000.0, floor=600.0)
    assert entry.rate >= 1100  # the first run at 1000/s missed, its repeat met: the search went up


def test_a_miss_the_server_fell_far_behind_on_is_not_measured_again() -> None:
    request = TuneRequest(10.0, seconds=20.0)
    server = FakeServer(capacity=1150.0, serves=1200.0)  # beyond 1150/s it serves 1,200/s at most
    entry = measured_max_rate(server, request, X1_8, 1500.0, steps=3, first=1000.0, floor=600.0)
    assert 1100 <= entry.rate <= 1150  # 1000 ✓, 1250 ✗ (served 96%: twice), 1125 ✓, 1187 ✗ (twice)
    assert len(entry.points) == 6
    far = FakeServer(capacity=1150.0, serves=1000.0)
    found = measured_max_rate(far, request, X1_8, 1500.0, steps=3, first=1000.0, floor=600.0)
    assert found.rate == entry.rate  # the same search
    assert len(found.points) == 4  # 1250/s served 80% and 1187/s 84%: each measured once


class FakeServers(FakeServer):
    """One capacity per configuration, set by ``prepare`` as the session's reload would."""

    def __init__(self, capacities: dict[BatcherConfig, float], miss_p99: float = 15.0) -> None:
        super().__init__(0.0, miss_p99=miss_p99)
        self.capacities, self.sent = capacities, []

    def prepare(self, config: BatcherConfig) -> None:
        self.capacity = self.capacities[config]
        self.sent.append((config, len(self.rates)))  # where each config's runs start


def test_challengers_start_at_the_leaders_rate_and_a_miss_there_ends_them() -> None:
    request = TuneRequest(10.0, seconds=20.0)
    servers = FakeServers({X2_8: 2500.0, X1_32: 2000.0, X2_32: 3300.0})
    listed = [ranked(X2_8, 2600), ranked(X1_32, 2500), ranked(X2_32, 2400)]  # the model's order
    measured = measure_shortlist(servers, request, listed)
    assert all(2.4 < span <= 2.5 for span in servers.spans)  # 2.5 s a point, not the request's 20
    by_config = {e.config: e for e in measured}
    leader = by_config[X2_8]
    assert 2275 <= leader.rate <= 2500 and leader.missed_at == 0  # bracketed around its 2600 prediction
    weaker = by_config[X1_32]
    assert weaker.rate == 0 and weaker.missed_at == leader.rate and len(weaker.points) == 2
    stronger = by_config[X2_32]
    assert leader.rate < stronger.rate <= 3300  # met the leader's rate, then searched above it
    assert [e.config for e in measured] == [X2_32, X2_8, X1_32]  # best measured first
    assert pick(listed, measured, request).config == X2_32
    start = dict(servers.sent)[X1_32]
    assert abs(servers.rates[start] - leader.rate) < 0.02 * leader.rate  # the challenge point


def test_the_operating_rate_rests_on_what_the_shortlist_measured_not_the_prediction() -> None:
    ranking = [ranked(X1_32, 5180), ranked(X2_8, 4600)]
    measured = [SweepEntry(X1_32, 3626, [], 20), SweepEntry(X2_8, 0, [], 10, missed_at=3626)]
    assert sustained(pick(ranking, measured, TuneRequest(10.0)), measured) == 3626  # not 5180
    assert sustained(ranking[0], []) == 5180  # nothing measured: the prediction
    assert sustained(ranking[1], measured) == 4600  # measured 0 (missed): the prediction, not 0


def test_after_a_whole_bracket_missed_the_next_is_bracketed_around_its_scaled_prediction() -> None:
    request = TuneRequest(10.0, seconds=20.0)
    x1_8_none = BatcherConfig(8, 0)
    # the first misses its whole bracket (its lowest miss, 1,820/s, is 0.7 of its prediction); the
    # second sustains 0.65 of its prediction: within its own bracket (0.6-1.5x) only below 0.7x, where
    # the bisection from its prediction never gets (1.0, 0.8, 0.7x)
    servers = FakeServers({X2_8: 1200.0, X1_32: 1625.0, x1_8_none: 1500.0})
    listed = [ranked(X2_8, 2600), ranked(X1_32, 2500), ranked(x1_8_none, 2400)]
    measured = {e.config: e for e in measure_shortlist(servers, request, listed)}
    assert measured[X2_8].rate == 0 and len(measured[X2_8].points) == 6
    starts = dict(servers.sent)
    scale = min(run.offered for run in measured[X2_8].points) / 2600
    assert 0.68 < scale < 0.72
    assert abs(servers.rates[starts[X1_32]] - scale * 2500) < 0.03 * 2500  # its scaled prediction
    assert 1400 <= measured[X1_32].rate <= 1625  # met the budget: the leader
    third = measured[x1_8_none]  # a challenger at the leader's rate, as before
    assert third.missed_at == measured[X1_32].rate and len(third.points) == 2


def test_when_nothing_met_the_budget_the_first_is_searched_below_its_lowest_miss() -> None:
    request = TuneRequest(10.0, seconds=20.0)
    servers = FakeServers({X2_8: 1200.0, X1_32: 900.0})  # both below 0.6x their predictions
    listed = [ranked(X2_8, 2600), ranked(X1_32, 2500)]
    measured = measure_shortlist(servers, request, listed)
    assert [e.rate for e in measured] == [0.0, 0.0] and measured[0].config == X2_8
    lowest, before = min(run.offered for run in measured[0].points), len(servers.rates)
    found = below_the_brackets(servers, request, measured)
    first = found[0]
    assert first.config == X2_8 and 1000 <= first.rate <= 1200 and first.passed_run is not None
    assert max(servers.rates[before:]) <= lowest  # searched in (0, the lowest rate it missed]
    assert first.points[: len(measured[0].points)] == measured[0].points  # every run kept
    assert found[1] is measured[1]
    assert pick(listed, found, request).config == X2_8 and sustained(listed[0], found) == first.rate
    assert below_the_brackets(servers, request, found) is found  # something met: nothing more measured
    assert len(servers.rates) == before + len(first.points) - len(measured[0].points)


def test_a_shortlist_miss_beyond_twice_the_budget_is_not_measured_again() -> None:
    """The same search on the same server, its misses near (15 ms) or far (50 ms) beyond the 10 ms
    budget: the shortlist repeats only the near ones (a far miss's repeat met the budget in 1 of 23
    cases here); the brute force's rule (``measured_max_rate`` alone) repeats both."""
    request = TuneRequest(10.0, seconds=20.0)
    near_server, far_server = FakeServers({X1_8: 1150.0}), FakeServers({X1_8: 1150.0}, miss_p99=50.0)
    near = measure_shortlist(near_server, request, [ranked(X1_8, 1000)], steps=3)[0]
    far = measure_shortlist(far_server, request, [ranked(X1_8, 1000)], steps=3)[0]
    assert near.rate == far.rate and 1100 <= far.rate <= 1150  # 1000 ✓, 1250 ✗, 1125 ✓, 1187 ✗
    assert len(near.points) == 6 and len(far.points) == 4  # the two misses: twice, then once
    assert len(far.rates) == len(far.points)
    brute = measured_max_rate(FakeServer(1150.0, miss_p99=50.0), request, X1_8, 1500.0, 3, 1000.0, 600.0)
    assert len(brute.points) == 6


def confirming(capacity: float, misses: int = 0) -> tuple[FakeServer, Confirmation]:
    server = FakeServer(capacity, misses=misses)
    found = confirm(server, X1_8, 1000.0, 10.0, TuneRequest(10.0).load, point_s=20.0)
    return server, found


def test_the_operating_rate_is_confirmed_by_two_runs_that_meet_the_budget() -> None:
    server, found = confirming(capacity=900.0)
    assert found.confirmed and found.rate == OPERATING_SHARE * 1000.0 and len(found.runs) == 2
    assert found.rates == (850.0, 850.0) and all(abs(r - 850) < 20 for r in server.rates)


def test_a_third_run_breaks_a_tie_between_the_first_two() -> None:
    _, found = confirming(capacity=900.0, misses=1)  # a neighbour's burst cost the first run the budget
    assert [run.p99_ms for run in found.runs] == [15.0, 5.0, 5.0]
    assert found.confirmed and found.rate == 850.0


def test_the_operating_rate_steps_down_while_most_runs_there_miss() -> None:
    _, found = confirming(capacity=800.0)  # 850/s misses twice: 722.5/s is measured next
    assert found.confirmed and found.rates == (850.0, 850.0, 722.5, 722.5)
    assert found.rate == 722.5
    _, hopeless = confirming(capacity=100.0)
    assert not hopeless.confirmed and len(hopeless.runs) == 2 * (CONFIRM_STEPS + 1)
    assert abs(hopeless.rate - 1000.0 * OPERATING_SHARE ** (CONFIRM_STEPS + 1)) < 1e-9
    assert verdict([], 10.0) is None


class NoisyServers(FakeServers):
    """Each configuration's first run at a rate is the odd draw: beyond its capacity a lucky pass, within
    it a disturbed miss; every further run there follows the capacity. The sweep's rule (a pass counts)
    believes the lucky draw; a majority of three does not."""

    def __init__(self, capacities: dict[BatcherConfig, float]) -> None:
        super().__init__(capacities)
        self.seen: dict[str, int] = {}

    def open_loop(self, arrivals: np.ndarray, label: str) -> SimpleNamespace:
        run = super().open_loop(arrivals, label)
        self.seen[label] = self.seen.get(label, 0) + 1
        if self.seen[label] == 1:
            ok = not run.meets(10.0)
            run.meets, run.p99_ms = (lambda budget: ok), (5.0 if ok else 15.0)
        return run


def test_the_rematch_holds_both_configurations_to_a_majority_of_their_runs_at_each_rate() -> None:
    request = TuneRequest(10.0, seconds=20.0)
    servers = NoisyServers({X2_32: 1500.0, X1_8: 2400.0})
    head_to_head = rematch(servers, request, [X2_32, X1_8], 4000.0, rounds=1)
    for config, capacity in ((X2_32, 1500.0), (X1_8, 2400.0)):
        (entry,) = head_to_head[config]
        assert 0.93 * capacity <= entry.rate <= capacity  # six points: within 4000/64 of the capacity
        assert len(entry.points) == 3 * 6  # each rate: the odd draw, then two that agree against it
    lucky = measured_max_rate(NoisyServers({X2_32: 1500.0}), request, X2_32, 4000.0)
    assert lucky.rate > 3800  # the sweep's rule: every first run beyond 1,500/s passed


def test_a_first_run_the_server_fell_far_behind_on_decides_a_miss_alone() -> None:
    behind = SimpleNamespace(meets=lambda budget: False, p99_ms=80.0, offered=3000.0, throughput=2000.0)
    kept_up = SimpleNamespace(meets=lambda budget: False, p99_ms=15.0, offered=3000.0, throughput=2990.0)
    met = SimpleNamespace(meets=lambda budget: True, p99_ms=5.0, offered=3000.0, throughput=3000.0)
    assert majority_kept_up([behind], 10.0) is False
    assert majority_kept_up([kept_up], 10.0) is None and majority_kept_up([kept_up, met], 10.0) is None
    assert majority_kept_up([kept_up, met, met], 10.0) is True
    assert majority_kept_up([met, behind, kept_up], 10.0) is False  # only a first run decides alone
