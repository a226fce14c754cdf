"""The measurement's settings (``perf.measure.engine.MeasureSettings``): a bad field is named; an open
loop's windows are sized so that those a run keeps hold the requests a p99 is judged on."""

from __future__ import annotations

import dataclasses
import logging
import math

import numpy as np
import pytest

from perf.errors import OptionError
from perf.measure.engine import (
    KEPT_CAP_S,
    P99_SAMPLES,
    Job,
    Measurement,
    MeasureSettings,
    OurEngine,
    sized_for,
)
from perf.measure.loads import closed_loop, poisson
from perf.measure.target import Target


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"max_windows": 0}, "max_windows"),
        ({"stable_windows": 4, "max_windows": 3}, "max_windows"),
        ({"stable_windows": 0}, "stable_windows"),
        ({"window_s": 0.0}, "window_s"),
        ({"window_s": -1.0}, "window_s"),
        ({"window_batches": 0}, "window_batches"),
        ({"p99_samples": 0}, "p99_samples"),
    ],
)
def test_measure_settings_name_the_bad_field(settings: dict, message: str) -> None:
    with pytest.raises(OptionError, match=message):
        MeasureSettings(**settings)


def test_a_fast_rate_is_offered_over_every_window_that_counts() -> None:
    """60,000/s over windows that end at 6 s: 360,000 arrivals, past ``arrival_times``' default cap, all
    counted; with the cap a server serving half the rate would be judged to have kept up."""
    windows = [(0.0, 2.0), (2.0, 4.0), (4.0, 6.0)]
    run = Measurement("fast", "m", poisson(60_000.0, seed=1), [], windows, (1, 3), True, 0)
    assert run.offered == pytest.approx(60_000.0, rel=0.01)


SETTINGS = MeasureSettings(warmup_s=0.0, window_s=0.6, stable_windows=3, max_windows=5)
ENOUGH = P99_SAMPLES + 4 * math.sqrt(P99_SAMPLES)  # the arrivals the kept windows are sized to expect


@pytest.mark.parametrize(
    ("load", "window_s"),
    [
        (closed_loop(1), 0.6),  # a closed loop sends as fast as it is answered: unchanged
        (poisson(300.0), 0.6),  # 3 × 0.6 s at 300/s expect 540 arrivals already: unchanged
        (poisson(20.0), ENOUGH / 20.0 / 3),  # 36 expected: stretched to 140
        (poisson(2.0), ENOUGH / 2.0 / 3),  # a tuner's search on a loaded host went this low
        (poisson(1.0), KEPT_CAP_S / 3),  # past the cap: 90 s together, 90 requests expected
        (poisson(0.1), KEPT_CAP_S / 3),  # not 23 minutes a run
    ],
)
def test_an_open_loops_kept_windows_expect_the_requests_a_p99_is_judged_on(load, window_s) -> None:
    sized = sized_for(SETTINGS, load, SETTINGS.stable_windows)
    assert sized.window_s == pytest.approx(window_s)
    assert dataclasses.replace(sized, window_s=SETTINGS.window_s) == SETTINGS  # nothing else changes
    assert sized_for(SETTINGS, poisson(20.0), 2).window_s == pytest.approx(ENOUGH / 20.0 / 2)  # two kept


def test_a_stretched_run_says_why_it_is_long(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="perf.measure.engine"):
        sized_for(SETTINGS, poisson(2.0), 3, "x @ 2/s")
        sized_for(SETTINGS, poisson(1.0), 3, "x @ 1/s")
    stretched, capped = caplog.messages
    assert stretched.startswith("x @ 2/s: windows of 23.3 s, not 0.6 s: the 3 that count expect 140 requests")
    assert "capped at 90 s: fewer than a p99 needs" in capped and "capped" not in stretched


def test_our_engine_measures_an_open_loop_in_windows_sized_for_a_p99() -> None:
    """Our client's windows follow the same rule (no server is needed to time them: every request
    fails on a closed port, and the windows close on the clock all the same)."""
    settings = MeasureSettings(warmup_s=0.0, window_s=0.05, stable_windows=2, max_windows=2, p99_samples=4)
    target = Target("m", "127.0.0.1:1", {"x": np.zeros((2, 3), np.float32)}, {"y": 4})
    run = OurEngine().run(Job(target, poisson(40.0, seed=1), settings))
    expected = (4 + 4 * 2) / 40.0 / 2  # 12 arrivals over the two windows: 0.15 s each, not 0.05
    assert len(run.windows) == 2 and all(end - start >= expected - 1e-3 for start, end in run.windows)
