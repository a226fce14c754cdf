"""The splitter: balanced cut points, cost fallbacks, and refusal of models it cannot cut."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from torch import nn

from exporters.errors import SpecError
from exporters.pipelines import splitter
from exporters.pipelines.splitter import SplitPlan, balanced_cuts, plan_split, sequential_blocks, split_blocks


def _max_stage(costs: list[float], cuts: tuple[int, ...]) -> float:
    return max(SplitPlan(cuts, tuple(costs), "given").stage_costs)


@pytest.mark.parametrize("seed", range(20))
def test_balanced_cuts_minimise_the_slowest_stage(seed: int) -> None:
    rng = np.random.default_rng(seed)
    costs = rng.uniform(0.1, 5.0, size=int(rng.integers(3, 9))).tolist()
    stages = int(rng.integers(1, len(costs) + 1))
    cuts = balanced_cuts(costs, stages)
    assert (
        len(cuts) == stages - 1 and list(cuts) == sorted(set(cuts)) and all(0 < c < len(costs) for c in cuts)
    )
    best = min(_max_stage(costs, c) for c in itertools.combinations(range(1, len(costs)), stages - 1))
    assert _max_stage(costs, cuts) == pytest.approx(best)


def test_heavy_first_block_gets_a_stage_of_its_own() -> None:
    assert balanced_cuts([5, 1, 1, 1, 1, 1], 2) == (1,)
    assert balanced_cuts([1, 1, 1, 1], 4) == (1, 2, 3)


def test_more_stages_than_blocks_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match="stages"):
        balanced_cuts([1.0, 2.0], 3)


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2)).eval()


def test_split_stages_compose_to_the_model() -> None:
    model, x = _model(), torch.randn(4, 8)
    plan = plan_split(model, x, 3, "p", balance="flops")
    stages = split_blocks(model, plan, "p")
    assert len(stages) == 3 and plan.cost_method == "flops"
    with torch.no_grad():
        out = x
        for stage in stages:
            out = stage(out)
        torch.testing.assert_close(out, model(x), rtol=0, atol=0)


def test_given_cut_points_are_used_and_checked() -> None:
    model, x = _model(), torch.randn(2, 8)
    assert plan_split(model, x, 2, "p", cut_points=(3,)).cuts == (3,)
    with pytest.raises(SpecError, match=r"p\.cut_points"):
        plan_split(model, x, 2, "p", cut_points=(5,))


def test_latency_falls_back_to_flops_when_timing_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("no timer here")

    monkeypatch.setattr(splitter, "measure_latency", broken)
    plan = plan_split(_model(), torch.randn(2, 8), 2, "p", balance="latency")
    assert plan.cost_method == "flops"


def test_zero_flops_fall_back_to_parameter_count() -> None:
    blocks = [nn.Embedding(10, 4), nn.Flatten()]  # lookups only: the FLOP counter sees zero
    costs, method = splitter.block_costs(blocks, torch.tensor([[1, 2], [3, 4]]), "flops")
    assert method == "params" and costs == [40.0, 0.0]


def test_no_usable_cost_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match="balance"):
        splitter.block_costs([nn.ReLU(), nn.ReLU()], torch.randn(2, 3), "flops")


def test_measured_latency_sees_the_expensive_block() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 512), nn.Linear(512, 512), nn.Linear(512, 4)).eval()
    costs = splitter.measure_latency(list(model), torch.randn(64, 4), repeats=5)
    assert costs[2] > costs[0]


def test_only_sequential_models_can_be_cut() -> None:
    with pytest.raises(SpecError, match=r"p\.split"):
        sequential_blocks(nn.Linear(2, 2), "p")
