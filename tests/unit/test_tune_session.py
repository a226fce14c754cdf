"""The tuner session's windows: sized once from the largest batch timed at the start, never from what a
run measured (no server: ``measure`` is replaced by one that records the windows it was given)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from exporters.resolve import load_spec
from perf.measure.engine import MeasureSettings, OurEngine
from perf.session.model import WINDOW_BATCHES, ModelSession

SPEC = Path(__file__).resolve().parents[2] / "models.yaml"
SETTINGS = MeasureSettings(warmup_s=0.1, window_s=0.1, stable_windows=3, max_windows=3)


def test_a_stalled_run_does_not_lengthen_the_windows_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = ModelSession(load_spec(SPEC), "recommender", 8, tmp_path, OurEngine(), SETTINGS)
    session.largest_batch_s = 0.02  # as timed at the start
    # a run in which the host stalled one execution of a batch of 8 for two seconds
    stalled = SimpleNamespace(
        stolen_share=0.0, stats=SimpleNamespace(batches={8: SimpleNamespace(compute_ns=2e9, executions=1)})
    )
    windows: list[float] = []

    def measure(target, load, settings, *args, **kwargs):
        windows.append(settings.window_s)
        return stalled

    monkeypatch.setattr("perf.session.model.measure", measure)
    monkeypatch.setattr(ModelSession, "endpoints", property(lambda self: None))
    monkeypatch.setattr(ModelSession, "target", property(lambda self: None))
    for label in ("first", "after the stall"):
        session.measure(load=None, label=label)
    assert windows == [pytest.approx(WINDOW_BATCHES * 0.02)] * 2
