"""Candidates that sit on the budget: their delay and one execution fill it at every rate, so the tuner
ranks them after the others and does not measure them (``Ranked.sits_on_budget``)."""

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
    assert waits.sits_on_budget(REQUEST.budget_ms) and not quick.sits_on_budget(REQUEST.budget_ms)
    ranking = rank(PROBED, REQUEST)
    assert [entry.config for entry in ranking] == [NO_DELAY, FIVE_MS]
    assert [entry.config for entry in shortlist_pool(ranking, REQUEST)] == [NO_DELAY]
    lines = "".join(_on_budget_lines(SimpleNamespace(request=REQUEST, ranking=ranking)))
    assert lines.startswith(f"Not measured: {FIVE_MS.label}.")
    assert _trickle_cell(waits, REQUEST.budget_ms).endswith("(on the budget)")
    assert "budget" not in _trickle_cell(quick, REQUEST.budget_ms)


def test_when_every_feasible_candidate_sits_on_the_budget_they_are_measured_all_the_same() -> None:
    tight = dataclasses.replace(REQUEST, budget_ms=6.0)  # 5 ms + 2 ms: the delay cannot meet it at all
    ranking = rank(PROBED, tight)
    assert [entry.config for entry in ranking if entry.best] == [NO_DELAY]
    assert ranking[0].sits_on_budget(tight.budget_ms)
    assert [entry.config for entry in shortlist_pool(ranking, tight)] == [NO_DELAY]
    lines = "".join(_on_budget_lines(SimpleNamespace(request=tight, ranking=ranking)))
    assert lines.startswith(f"Measured anyway, since every feasible candidate is one: {NO_DELAY.label}.")
