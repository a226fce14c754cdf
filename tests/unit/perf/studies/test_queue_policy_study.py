"""The queue-policy study's parts without a server: its four configurations, its goal's arithmetic,
and the exporter's check that shares its instance rule."""

from __future__ import annotations

import pytest

from exporters.configs.models import build_model_config, lacks_spare_instances
from exporters.schema.models import parse_spec
from perf.errors import OptionError
from perf.studies.profiles import get_profile
from perf.studies.queue_policy_study import (
    VARIANTS,
    Point,
    QueuePolicyStudy,
    capacity,
    stall_goal,
    study_models,
)


def _point(variant: str, load: str, slow: int = 0, throughput: float = 100.0) -> Point:
    return Point(variant, load, 1000, 0, throughput, 5.0, 20.0, 30.0, slow)


def test_the_four_configurations_differ_only_in_queue_policy_and_instances() -> None:
    spec = parse_spec({"models": study_models()})
    configs = {v.key: build_model_config(spec.model(v.model), num_gpus=0) for v in VARIANTS}
    for variant in VARIANTS:
        config = configs[variant.key]
        policy = config.dynamic_batching.default_queue_policy
        assert (policy is not None) == variant.policy
        assert [g.count for g in config.instance_group] == [variant.instances]
        assert config.dynamic_batching.max_queue_delay_microseconds == 1000
    first = spec.model(VARIANTS[0].model)
    for variant in VARIANTS[1:]:
        model = spec.model(variant.model)
        assert (model.source, model.options, model.seed, model.inputs) == (
            first.source, first.options, first.seed, first.inputs
        )  # fmt: skip


def test_goal_counts_only_what_the_policy_adds_on_spare_instances() -> None:
    points = [
        _point("none_x1", "closed"), _point("policy_x1", "closed", slow=40),
        _point("none_spare", "closed", slow=1), _point("policy_spare", "closed", slow=1),
        _point("none_x1", "open"), _point("policy_x1", "open", slow=2),
        _point("none_spare", "open"), _point("policy_spare", "open"),
    ]  # fmt: skip
    goal = stall_goal(points)
    assert goal.met is True and goal.measured.startswith("+0 (1 instance with the policy: 42 slow)")
    points[3] = _point("policy_spare", "closed", slow=3)
    goal = stall_goal(points)
    assert goal.met is False and goal.measured.startswith("+2")


def test_open_loop_rate_is_set_below_both_capacities_without_the_policy() -> None:
    points = [
        _point("none_x1", "closed", throughput=1000), _point("policy_x1", "closed", throughput=400),
        _point("none_spare", "closed", throughput=700), _point("policy_spare", "closed", throughput=750),
    ]  # fmt: skip
    assert capacity(points) == 700  # the stalled policy row does not set the rate


def test_profile_runs_the_study_when_asked() -> None:
    assert QueuePolicyStudy().steps(get_profile("smoke")) == 0
    assert QueuePolicyStudy().steps(get_profile("quick")) == 2 + 2 * len(VARIANTS)
    with pytest.raises(OptionError, match="queue_policy_s must be >= 0"):
        get_profile("quick", queue_policy_s=-1.0)


def test_exporter_flags_a_queue_policy_with_too_few_instances() -> None:
    """``exporters build`` warns, for the configs it wrote, by the rule the study measures."""
    spec = parse_spec({"models": study_models()})
    flagged = {v.key for v in VARIANTS if lacks_spare_instances(build_model_config(spec.model(v.model), 0))}
    assert flagged == {"policy_x1"}  # a policy on 1 instance; not on 4, not without a policy
    gpu_entry = {**study_models()[3], "target": "auto", "instances": {"cpu": 4, "per_gpu": 1}}
    two_gpus = build_model_config(parse_spec({"models": [gpu_entry]}).models[0], num_gpus=2)
    assert [g.count for g in two_gpus.instance_group] == [1, 1] and lacks_spare_instances(two_gpus)
