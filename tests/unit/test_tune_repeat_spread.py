"""The verification's repeat spread: how far two runs of one point disagree (the prediction's
yardstick), from the points' own repeats."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from perf.tune.batcher_sim import BatcherConfig
from perf.tune.tuner import Point, repeat_spread


def run(p99_ms: float, served: float = 1000.0) -> SimpleNamespace:
    return SimpleNamespace(p99_ms=p99_ms, offered=1000.0, throughput=served)


def point(*repeats: SimpleNamespace) -> Point:
    return Point(BatcherConfig(8, 0), 1000.0, predicted=None, repeats=list(repeats))


def test_the_spread_is_the_median_ratio_of_each_points_two_repeats_kept_up_only() -> None:
    """Three points count (ratios 1.3, 2 and 1.1, in either order); a point measured once and one
    whose repeat fell far behind the offered rate (its p99 is its backlog) do not."""
    points = [
        point(run(10), run(13)),
        point(run(16), run(8)),
        point(run(5), run(5.5)),
        point(run(7)),
        point(run(6), run(400, served=700)),
    ]
    spread = repeat_spread(points)
    assert spread is not None and spread.points == 3
    assert spread.median_ratio == pytest.approx(1.3)
    assert spread.beyond_goal == pytest.approx(2 / 3)  # 1.3 and 2 exceed 1.2; 1.1 does not


def test_no_point_measured_twice_gives_no_spread() -> None:
    assert repeat_spread([point(run(7)), point(run(6), run(300, served=500))]) is None


def test_the_report_says_the_spread_next_to_the_operating_points_repeats() -> None:
    from perf.tune.report import _repeat_spread_line

    numbers = {"measured_p99_each_repeat_ms": [7.1, 9.2], "repeat_spread": None}
    assert "no repeat spread" in _repeat_spread_line(numbers)
    numbers["repeat_spread"] = {"points": 12, "median_ratio": 1.23, "beyond_goal": 0.5}
    line = _repeat_spread_line(numbers)
    assert "7.1, 9.2 ms" in line and "1.23× the lower" in line and "more than 1.2× in 50%" in line
    assert "tighter than what one server run typically reproduces" in line  # the median beyond 1.2
    numbers["repeat_spread"] = {"points": 12, "median_ratio": 1.1, "beyond_goal": 0.25}
    line = _repeat_spread_line(numbers)
    assert "more than 1.2× in 25% of them." in line and "tighter" not in line
