"""The brute force's head-to-head figures: the least disturbed round of each, and the 10% verdict."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from perf.tune.batcher_sim import BatcherConfig
from perf.tune.measured import SweepEntry
from perf.tune.report import _rematch_lines, brute_force_figures, rematch_figures

BEST, PICK = BatcherConfig(32, 500, instances=2), BatcherConfig(8, 2000, instances=2)


def entries(config: BatcherConfig, *rates: float) -> list[SweepEntry]:
    return [SweepEntry(config, rate, [], 30.0) for rate in rates]


def test_each_config_counts_its_best_round_and_the_verdict_follows_the_ratio() -> None:
    sweep = [*entries(BEST, 3197.0), *entries(PICK, 2344.0)]  # the sweep's order: best first
    rematch = {BEST: entries(BEST, 3410.0, 2451.0), PICK: entries(PICK, 2131.0, 2451.0)}
    figures = rematch_figures(SimpleNamespace(chosen=PICK), sweep, rematch)
    assert figures["best_rate"] == 3410.0 and figures["chosen_rate"] == 2451.0
    assert figures["chosen_over_best"] == pytest.approx(2451 / 3410)
    assert figures["seconds"] == 120.0  # every round of both, not the sweep's time
    assert "**missed**" in "".join(_rematch_lines(figures))
    close = {BEST: entries(BEST, 1210.0, 1320.0), PICK: entries(PICK, 770.0, 1210.0)}
    slower = [*entries(BEST, 1979.0), *entries(PICK, 1320.0)]  # a sweep on a slower machine
    assert "**met**" in "".join(_rematch_lines(rematch_figures(SimpleNamespace(chosen=PICK), slower, close)))


def test_a_pick_that_is_the_sweeps_best_is_compared_with_itself() -> None:
    sweep = entries(PICK, 2000.0)
    figures = rematch_figures(SimpleNamespace(chosen=PICK), sweep, {PICK: entries(PICK, 1900.0, 2100.0)})
    assert figures["chosen_over_best"] == 1.0 and figures["best_rate"] == 2100.0


def test_a_rematch_where_the_sweeps_best_collapsed_gives_no_verdict() -> None:
    sweep = [*entries(BEST, 1498.0), *entries(PICK, 936.0)]
    collapsed = {BEST: entries(BEST, 94.0, 0.0), PICK: entries(PICK, 749.0, 0.0)}
    figures = rematch_figures(SimpleNamespace(chosen=PICK), sweep, collapsed)
    assert figures["disturbed"] and "no verdict" in "".join(_rematch_lines(figures))
    steady = {BEST: entries(BEST, 1400.0, 1300.0), PICK: entries(PICK, 936.0, 900.0)}
    assert not rematch_figures(SimpleNamespace(chosen=PICK), sweep, steady)["disturbed"]


def test_the_time_goal_leaves_out_on_both_sides_the_runs_measured_again_while_stolen() -> None:
    """A 160 s stretch of steal in the tuner's 200 s would make its time 0.2 of a 1,000 s sweep; the
    goal compares what each method measured: (200 - 160) / (1,000 - 0)."""
    sweep = [*entries(BEST, 3197.0), *entries(PICK, 2344.0)] * 20  # 40 candidates of 30 s
    result = SimpleNamespace(chosen=PICK, tuner_s=240.0, stolen_s=160.0)
    figures = brute_force_figures(result, sweep, sweep_stolen_s=200.0)
    assert figures["seconds"] == 1200.0 and figures["tuner_seconds"] == 240.0
    assert figures["best"] == BEST.label and figures["chosen_rate_measured_by_sweep"] == 2344.0
    assert figures["net_ratio"] == pytest.approx(80.0 / 1000.0)
    assert brute_force_figures(result, sweep, 0.0)["net_ratio"] == pytest.approx(80.0 / 1200.0)
