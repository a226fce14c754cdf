"""Candidates that sit on the budget: their delay and one execution fill it at every rate, so the tuner
ranks them after the others and does not measure them (``Ranked.sits_on_budget``); where the machine's
own tail fills it, nothing is set apart."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from perf.tune.batcher_sim import BatcherConfig, ServiceModel
from perf.tune.candidates import Grid
from perf.tune.predict import trickle
from perf.tune.report import _on_budget_lines, _trickle_cell
from perf.tune.tuner import HEADROOM, TuneRequest, rank, shortlist_pool

# Batches of any size run 2 ms, plus 0.5 ms outside the batcher: batching is free, so a 5 ms delay is
# predicted to sustain as much as none.
SERVICE = ServiceModel(0.002, 0.0, overhead_s=0.0005)
PROBED = SimpleNamespace(services={1: SERVICE})
NO_DELAY, FIVE_MS = BatcherConfig(8, 0), BatcherConfig(8, 5000)
REQUEST = TuneRequest(
    10.0, grid=Grid(delays_us=(0, 5000), max_batches=(8,), instances=(1,), no_batching=False)
)


def test_at_a_trickle_a_request_waits_the_whole_delay_then_one_execution() -> None:
    # 5 ms delay + 2 ms execution + 0.5 ms overhead for the request that opened its batch
    assert trickle(FIVE_MS, SERVICE).p99_ms == pytest.approx(7.5, abs=0.05)
    assert trickle(NO_DELAY, SERVICE).p99_ms < 5.0


def test_a_candidate_whose_delay_fills_the_budget_is_ranked_after_the_others_and_not_measured() -> None:
    by_config = {entry.config: entry for entry in rank(PROBED, REQUEST)}
    waits, quick = by_config[FIVE_MS], by_config[NO_DELAY]
    assert waits.rate >= quick.rate > 0  # by predicted rate alone the 5 ms delay would come first
    assert waits.trickle.p99_ms * HEADROOM > REQUEST.budget_ms >= quick.trickle.p99_ms * HEADROOM
    assert waits.trickle_without_delay.p99_ms == quick.trickle.p99_ms  # same family, same arrivals
    assert waits.sits_on_budget(REQUEST.budget_ms) and not quick.sits_on_budget(REQUEST.budget_ms)
    ranking = rank(PROBED, REQUEST)
    assert [entry.config for entry in ranking] == [NO_DELAY, FIVE_MS]
    assert [entry.config for entry in shortlist_pool(ranking, REQUEST)] == [NO_DELAY]
    lines = "".join(_on_budget_lines(SimpleNamespace(request=REQUEST, ranking=ranking)))
    assert lines.startswith(f"Not measured: {FIVE_MS.label}.")
    assert _trickle_cell(waits, REQUEST.budget_ms).endswith("without the delay), on the budget")
    assert "budget" not in _trickle_cell(quick, REQUEST.budget_ms)


def test_where_the_machines_own_tail_fills_the_budget_no_candidate_is_set_apart() -> None:
    # 5 ms outside the batcher: 7 ms at a trickle without any delay, 8 ms with 1 ms; both within x1.5
    slow = SimpleNamespace(services={1: ServiceModel(0.002, 0.0, overhead_s=0.005)})
    request = dataclasses.replace(REQUEST, grid=dataclasses.replace(REQUEST.grid, delays_us=(0, 1000)))
    ranking = rank(slow, request)
    assert all(entry.best and entry.trickle.p99_ms * HEADROOM > request.budget_ms for entry in ranking)
    assert not any(entry.sits_on_budget(request.budget_ms) for entry in ranking)
    assert len(shortlist_pool(ranking, request)) == 2
    assert _on_budget_lines(SimpleNamespace(request=request, ranking=ranking)) == []


def test_when_every_feasible_candidate_sits_on_the_budget_they_are_measured_all_the_same() -> None:
    only_five = dataclasses.replace(REQUEST, grid=dataclasses.replace(REQUEST.grid, delays_us=(5000,)))
    ranking = rank(PROBED, only_five)
    assert [entry.config for entry in ranking] == [FIVE_MS] and ranking[0].sits_on_budget(10.0)
    assert [entry.config for entry in shortlist_pool(ranking, only_five)] == [FIVE_MS]
    lines = "".join(_on_budget_lines(SimpleNamespace(request=only_five, ranking=ranking)))
    assert lines.startswith(f"Measured anyway, since every feasible candidate is one: {FIVE_MS.label}.")
