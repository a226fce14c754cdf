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
    return max(splitter.stage_sums(costs, cuts))


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
    costs = splitter.block_costs(blocks, torch.tensor([[1, 2], [3, 4]]), "flops")
    assert costs.method == "params" and costs.values == [40.0, 0.0] and costs.noise == 0


def test_no_usable_cost_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match="balance"):
        splitter.block_costs([nn.ReLU(), nn.ReLU()], torch.randn(2, 3), "flops")


def test_measured_latency_sees_the_expensive_block() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 512), nn.Linear(512, 512), nn.Linear(512, 4)).eval()
    costs, noise = splitter.measure_latency(list(model), torch.randn(64, 4), repeats=5)
    assert costs[2] > costs[0] and noise >= 0


def test_only_sequential_models_can_be_cut() -> None:
    with pytest.raises(SpecError, match=r"p\.split"):
        sequential_blocks(nn.Linear(2, 2), "p")


# --- a cut that timing noise cannot move -------------------------------------------------------------


class JitteryClock:
    """Stands in for ``time`` inside ``measure_latency``: each pair of readings brackets one block's run,
    and the block takes its ``costs`` entry plus up to ``jitter`` of it (interference only adds time).
    Timing is faked, not the splitter: the real blocks run, the real rounds and choice follow."""

    def __init__(self, costs: list[float], seed: int, jitter: float = 0.04) -> None:
        self.costs, self.rng, self.jitter = costs, np.random.default_rng(seed), jitter
        self.now, self.readings = 0.0, 0

    def perf_counter(self) -> float:
        self.readings += 1
        if self.readings % 2 == 0:  # the reading after a block ran
            cost = self.costs[(self.readings // 2 - 1) % len(self.costs)]
            self.now += cost * (1 + self.rng.uniform(0, self.jitter))
        return self.now


def _linear_blocks() -> nn.Sequential:
    """FLOPs per row 128, 128, 128, 512, 512: of the cuts (2,) and (3,), (3,) balances FLOPs better."""
    torch.manual_seed(0)
    widths = [(8, 8), (8, 8), (8, 8), (8, 32), (32, 8)]
    return nn.Sequential(*(nn.Linear(a, b) for a, b in widths)).eval()


def _plans_under_jitter(
    monkeypatch: pytest.MonkeyPatch, latency: list[float], seeds: range
) -> list[SplitPlan]:
    model, x, plans = _linear_blocks(), torch.randn(4, 8), []
    for seed in seeds:
        monkeypatch.setattr(splitter, "time", JitteryClock(latency, seed))
        plans.append(plan_split(model, x, 2, "p", balance="latency"))
    return plans


def test_near_equal_cuts_do_not_flip_with_timing_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    # (2,) and (3,) both have a slowest stage of 5: which one the fastest rounds favour is chance
    plans = _plans_under_jitter(monkeypatch, [3.0, 1.0, 1.0, 1.0, 3.0], range(30))
    fastest = {balanced_cuts(p.block_costs, 2) for p in plans}
    assert fastest == {(2,), (3,)}, "the jitter must move the fastest measured cut, or this proves nothing"
    assert {p.cuts for p in plans} == {(3,)}  # the better FLOPs balance, every time
    for plan in plans:
        assert set(plan.near_cuts) == {(2,), (3,)} and plan.near_cuts[0] == (3,)
        assert plan.tie_method == "flops" and plan.noise >= splitter.MIN_LATENCY_NOISE
        assert "2 cuts within" in plan.reason and "best balance of flops" in plan.reason


def test_a_clearly_faster_cut_still_wins_over_flops(monkeypatch: pytest.MonkeyPatch) -> None:
    # (2,): slowest 4.5; (3,): slowest 5, 11% slower, though FLOPs favour it
    plans = _plans_under_jitter(monkeypatch, [3.0, 1.0, 1.0, 1.0, 2.5], range(10))
    assert {p.cuts for p in plans} == {(2,)}
    assert all(p.near_cuts == ((2,),) and "clear of every other cut" in p.reason for p in plans)


def _brute_force(costs: list[float], stages: int, within: tuple[list[float], float]) -> float:
    other, limit = within
    feasible = [
        c for c in itertools.combinations(range(1, len(costs)), stages - 1) if _max_stage(other, c) <= limit
    ]
    return min(_max_stage(costs, c) for c in feasible)


@pytest.mark.parametrize("seed", range(20))
def test_balanced_cuts_within_a_limit_are_exact(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 9))
    costs, other = rng.uniform(0.1, 5.0, size=n).tolist(), rng.uniform(0.1, 5.0, size=n).tolist()
    stages = int(rng.integers(2, n + 1))
    limit = max(splitter.stage_sums(other, balanced_cuts(other, stages))) * float(rng.uniform(1.0, 1.5))
    cuts = balanced_cuts(costs, stages, within=(other, limit))
    assert _max_stage(other, cuts) <= limit
    assert _max_stage(costs, cuts) == pytest.approx(_brute_force(costs, stages, (other, limit)))
    near = set(splitter.cuts_within(other, stages, limit))
    every = itertools.combinations(range(1, n), stages - 1)
    assert near == {c for c in every if _max_stage(other, c) <= limit} and cuts in near


def test_steady_cuts_ignore_noise_within_the_tolerance() -> None:
    """Three stages, three optima; noise well inside the tolerance moves the fastest measured cut but
    never the choice, which FLOPs make."""
    latency = np.array([2.0, 1.0, 1.0, 2.0, 1.0, 1.0, 2.0, 1.0])  # (2, 5), (3, 5), (3, 6): slowest 4
    flops = splitter.BlockCosts([5.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], "flops")  # (2, 5): 6, others 7
    rng, chosen, fastest = np.random.default_rng(0), set(), set()
    for _ in range(50):
        noisy = (latency * rng.uniform(0.99, 1.01, size=len(latency))).tolist()
        plan = splitter.steady_cuts(splitter.BlockCosts(noisy, "latency", 0.03), 3, flops)
        chosen.add(plan.cuts)
        fastest.add(balanced_cuts(noisy, 3))
        assert set(plan.near_cuts) == {(2, 5), (3, 5), (3, 6)}
    assert len(fastest) > 1 and chosen == {(2, 5)}


def test_counted_costs_keep_the_plain_balanced_cut() -> None:
    costs = splitter.BlockCosts([5.0, 1.0, 1.0, 1.0, 1.0, 1.0], "flops")
    plan = splitter.steady_cuts(costs, 2, None)
    assert plan.cuts == (1,) and plan.near_cuts == ((1,),) and plan.noise == 0 and plan.tie_method == ""
    assert plan.reason == "the best slowest stage by flops"


def test_many_near_cuts_are_recorded_in_part() -> None:
    costs = splitter.BlockCosts([1.0] * 40, "latency", 2.0)  # everything is within a 200% noise
    plan = splitter.steady_cuts(costs, 2, None)
    assert len(plan.near_cuts) == splitter.RECORDED_NEAR_CUTS and plan.near_cuts[0] == plan.cuts
    assert plan.reason.startswith(f"more than {splitter.RECORDED_NEAR_CUTS} cuts within the 200.0% noise")
