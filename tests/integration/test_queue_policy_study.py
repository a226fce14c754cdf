"""A short queue-policy study against the real server, through ``make perf``'s framework: the server
loads the four configurations the report names, every request is accounted for, and the report and
goal are complete. No speed and no stall count is asserted (both depend on the machine)."""

from __future__ import annotations

import json

import pytest

from perf.studies.framework import StudyContext
from perf.studies.profiles import get_profile
from perf.studies.queue_policy_study import POLICY, STALL_MS, VARIANTS, QueuePolicyStudy

# A hang guard, not a speed check: many times the study's setup on a loaded two-core host.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    folder = tmp_path_factory.mktemp("queue-policy-study")
    profile = get_profile("smoke", queue_policy_s=0.75)  # 8 spans of 0.75 s
    steps: list[str] = []
    report = QueuePolicyStudy().run(StudyContext(profile, folder, folder / "work", progress=steps.append))
    return report, json.loads((folder / "queue_policy.json").read_text()), steps, profile


def test_server_loaded_the_configurations_the_report_names(study) -> None:
    _, figures, _, _ = study
    assert figures["served"] == {
        v.model: {"max_queue_size": POLICY["max_queue_size"] if v.policy else 0, "instances": v.instances}
        for v in VARIANTS
    }


def test_every_configuration_is_measured_under_both_loads(study) -> None:
    _, figures, steps, profile = study
    points = figures["points"]
    expected = {(v.key, load) for v in VARIANTS for load in ("closed", "open")}
    assert {(p["variant"], p["load"]) for p in points} == expected
    for point in points:
        assert point["sent"] > 0 and 0 <= point["slow"] <= point["sent"] - point["failed"], point
        if point["load"] == "closed":  # the closed loop never exceeds the client's in-flight bound
            assert point["failed"] == 0, point
    without = [p for p in points if p["load"] == "closed" and not p["variant"].startswith("policy")]
    closed = [p["throughput"] for p in without]
    assert figures["open_loop_rate"] == pytest.approx(profile.poisson_fraction * min(closed))
    assert len(steps) == QueuePolicyStudy().steps(profile)


def test_report_has_the_table_and_the_goal(study) -> None:
    report, _, _, _ = study
    text = report.path.read_text()
    assert f"> {STALL_MS:g} ms" in text and "Poisson" in text and "closed loop" in text
    assert [g.name for g in report.goals] == ["queue policy with spare instances"]
    assert report.goals[0].met is not None
