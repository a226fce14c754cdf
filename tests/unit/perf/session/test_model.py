"""The tuner session's windows: sized once from the largest batch timed at the start, never from what a
run measured (a host that stalls one execution must not lengthen every run after it)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from exporters.resolve import load_spec
from perf.measure.engine import MeasureSettings, OurEngine
from perf.session.model import ModelSession, windows_for

SPEC = Path(__file__).resolve().parents[4] / "models.yaml"
SETTINGS = MeasureSettings(warmup_s=0.1, window_s=0.1, stable_windows=3, max_windows=3)


def test_windows_last_at_least_the_batches_of_the_largest_batch_timed() -> None:
    assert windows_for(SETTINGS, 0.02).window_s == pytest.approx(SETTINGS.window_batches * 0.02)
    assert windows_for(SETTINGS, 0.001) is SETTINGS  # 20 batches of 1 ms fit the 0.1 s window
    lengthened = windows_for(SETTINGS, 0.02)
    assert (lengthened.warmup_s, lengthened.stable_windows, lengthened.max_windows) == (0.1, 3, 3)


def test_a_stalled_run_does_not_lengthen_the_windows_after_it(tmp_path: Path) -> None:
    session = ModelSession(load_spec(SPEC), "recommender", 8, tmp_path, OurEngine(), SETTINGS)
    session.largest_batch_s = 0.02  # as timed at the start
    before = session.sized(SETTINGS)
    # a run in which the host stalled one execution of a batch of 8 for two seconds
    session.runs.append(
        SimpleNamespace(stats=SimpleNamespace(batches={8: SimpleNamespace(compute_ns=2e9, executions=1)}))
    )
    assert session.sized(SETTINGS) == before
    assert before.window_s == pytest.approx(SETTINGS.window_batches * 0.02)


def test_a_stolen_run_is_measured_again_only_where_the_settings_say(tmp_path: Path) -> None:
    """The session's host-noise policy follows its windows' settings: ``make tune`` and ``make plan``
    measure a stolen run once more; a test's windows can say not to."""
    spec = load_spec(SPEC)
    again = ModelSession(spec, "recommender", 8, tmp_path, OurEngine(), SETTINGS)
    once = ModelSession(
        spec, "recommender", 8, tmp_path, OurEngine(), replace(SETTINGS, remeasure_stolen=False)
    )
    assert again.noise.remeasure and not once.noise.remeasure
