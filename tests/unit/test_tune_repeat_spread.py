"""The verification's passes and repeat spread: the operating point measured three times a pass and
judged on its median, and how far two runs of one point a pass apart disagree (the prediction's
yardstick), from the points' own repeats."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from perf.tune.batcher_sim import BatcherConfig
from perf.tune.tuner import OPERATING_RUNS_PER_PASS, Point, pass_order, repeat_spread


def run(p99_ms: float, served: float = 1000.0) -> SimpleNamespace:
    return SimpleNamespace(p99_ms=p99_ms, offered=1000.0, throughput=served)


CHOSEN = BatcherConfig(8, 0)


def point(*repeats: SimpleNamespace, config: BatcherConfig = CHOSEN, rate: float = 1000.0) -> Point:
    return Point(config, rate, predicted=None, repeats=list(repeats))


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
    spread = repeat_spread(points, passes=2)
    assert spread is not None and spread.points == 3
    assert spread.median_ratio == pytest.approx(1.3)
    assert spread.beyond_goal == pytest.approx(2 / 3)  # 1.3 and 2 exceed 1.2; 1.1 does not


def test_no_point_measured_twice_gives_no_spread() -> None:
    assert repeat_spread([point(run(7)), point(run(6), run(300, served=500))], passes=2) is None
    assert repeat_spread([point(run(7), run(9), run(30))], passes=1) is None  # one pass: no pair


def test_a_pass_measures_the_operating_point_three_times_and_the_spread_pairs_each_pass_first_run() -> None:
    """The operating point before its configuration's points, in its place and after them, then the
    neighbours'; two passes give it six runs, judged on their median. The spread pairs its first run
    of each pass (runs 1 and 4: 10 and 20 ms, ×2), not two runs of one pass (10 and 11 ms)."""
    chosen, neighbour = CHOSEN, BatcherConfig(8, 500)
    low, operating, high = (point(config=chosen, rate=rate) for rate in (500.0, 850.0, 1000.0))
    other = point(config=neighbour)
    order = pass_order([low, operating, high, other], operating)
    assert order == [operating, low, operating, high, operating, other]
    assert order.count(operating) == OPERATING_RUNS_PER_PASS
    operating.repeats = [run(p99) for p99 in (10, 11, 30, 20, 9, 12)]
    assert operating.median_p99_ms == 11.5 and operating.measured.p99_ms == 9
    spread = repeat_spread([operating], passes=2)
    assert spread is not None and spread.points == 1 and spread.median_ratio == pytest.approx(2.0)


def test_the_report_says_the_spread_next_to_the_operating_points_repeats() -> None:
    from perf.tune.report import _repeat_spread_line

    numbers = {"repeat_spread": None}
    repeats = [SimpleNamespace(p99_ms=p99, stolen_share=0.0) for p99 in (7.1, 9.2, 8.0)]
    line = _repeat_spread_line(numbers, repeats)
    assert "runs measured 7.1, 9.2, 8.0 ms (their median counts);" in line and "no repeat spread" in line
    numbers["repeat_spread"] = {"points": 12, "median_ratio": 1.23, "beyond_goal": 0.5}
    line = _repeat_spread_line(numbers, repeats)
    assert "7.1, 9.2, 8.0 ms" in line and "1.23× the lower" in line and "more than 1.2× in 50%" in line
    assert "one run is no yardstick for p99 within 20%" in line  # the median beyond 1.2
    assert "stolen" not in line
    numbers["repeat_spread"] = {"points": 12, "median_ratio": 1.1, "beyond_goal": 0.25}
    line = _repeat_spread_line(numbers, repeats)
    assert "more than 1.2× in 25% of them." in line and "yardstick" not in line


def test_the_report_says_which_of_the_operating_points_runs_counted_still_stolen() -> None:
    """A run that counted with the host's steal in it is marked where its p99 is quoted, and the
    headline says how many: the measured p99 then holds the host's other guests."""
    from perf.tune.report import _repeat_spread_line

    repeats = [SimpleNamespace(p99_ms=p99, stolen_share=share) for p99, share in ((27.8, 0.12), (7.6, 0.0))]
    line = _repeat_spread_line({"repeat_spread": None}, repeats)
    assert "runs measured 27.8 (12.0% stolen), 7.6 ms (their median counts); 1 of the 2 counted" in line
    assert "perf.tune.steal_check" in line
