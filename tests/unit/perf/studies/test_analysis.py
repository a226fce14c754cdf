"""The batching study's figures and goals, from a run's results (``perf.studies.analysis``)."""

from __future__ import annotations

import dataclasses
import math

from perf.studies.analysis import GOAL_FAMILY, for_model, outside_server_ms
from perf.studies.goals import Goal


def test_the_latency_outside_the_server_is_never_negative() -> None:
    assert outside_server_ms(10.0, 2.0, 3.0) == 5.0
    assert math.isnan(outside_server_ms(10.0, 20.0, 43.86))  # was reported as -53.86 ms


def test_the_recommenders_batching_target_is_not_applied_to_other_models() -> None:
    missed = Goal("dynamic vs none", "throughput ≥ 4× none", "dyn: 1.10× QPS", False, "…")
    assert for_model(missed, GOAL_FAMILY) == dataclasses.replace(missed, model=GOAL_FAMILY)
    own = for_model(missed, "sequence_gru")
    assert own.verdict == "n/a" and own.measured == missed.measured and "not applicable" in own.limits
    assert own.model == "sequence_gru"
    other = Goal("served vs raw", "≥ 0.9×", "0.5×", False)
    assert for_model(other, "sequence_gru") == dataclasses.replace(other, model="sequence_gru")
