"""The measurement's settings (``perf.measure.engine.MeasureSettings``): a bad field is named."""

from __future__ import annotations

import pytest

from perf.errors import OptionError
from perf.measure.engine import MeasureSettings


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"max_windows": 0}, "max_windows"),
        ({"stable_windows": 4, "max_windows": 3}, "max_windows"),
        ({"stable_windows": 0}, "stable_windows"),
        ({"window_s": 0.0}, "window_s"),
        ({"window_s": -1.0}, "window_s"),
        ({"window_batches": 0}, "window_batches"),
    ],
)
def test_measure_settings_name_the_bad_field(settings: dict, message: str) -> None:
    with pytest.raises(OptionError, match=message):
        MeasureSettings(**settings)
