"""Cut a model made of an ordered sequence of blocks into K contiguous stages of balanced cost.

A pipeline runs at the pace of its slowest stage, so the cut points should equalise stage latency.
Latency is measured (each block timed on the real activation it receives) because the proxies mislead:
a CNN's stem has few parameters but runs at the highest resolution. FLOPs are the fallback where timing
is impossible (a block fails to run alone, or times round to zero), parameter count the last resort.
Given cut points (``models.yaml``) skip the costing altogether.

Pure torch, no I/O: ``plan_split`` chooses, ``split_blocks`` cuts; ``stages.check_stages``
proves that the stages run in sequence equal the whole model before anything is written.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from exporters.errors import SpecError

log = logging.getLogger(__name__)

COST_METHODS = ("latency", "flops", "params")  # a balance falls back to the methods after it


@dataclass(frozen=True)
class SplitPlan:
    """Where the stages start and why: ``cuts[k]`` is the index of the first block of stage ``k + 1``."""

    cuts: tuple[int, ...]
    block_costs: tuple[float, ...]
    cost_method: str  # latency | flops | params | given

    def stage_ranges(self) -> list[tuple[int, int]]:
        """``[start, stop)`` block indices of each stage."""
        bounds = [0, *self.cuts, len(self.block_costs)]
        return list(itertools.pairwise(bounds))

    @property
    def stage_costs(self) -> tuple[float, ...]:
        return tuple(sum(self.block_costs[a:b]) for a, b in self.stage_ranges())


def sequential_blocks(model: nn.Module, what: str) -> list[nn.Module]:
    """The ordered blocks of an ``nn.Sequential``; anything else cannot be cut at block boundaries."""
    if not isinstance(model, nn.Sequential) or len(model) == 0:
        raise SpecError(
            f"{what}.split", f"blocks needs an nn.Sequential of blocks, got {type(model).__name__}"
        )
    return list(model)


def _block_inputs(blocks: Sequence[nn.Module], example: torch.Tensor) -> list[torch.Tensor]:
    """The activation each block receives when the whole sequence runs on ``example``."""
    inputs, x = [], example
    with torch.inference_mode():
        for block in blocks:
            inputs.append(x)
            x = block(x)
    return inputs


def measure_latency(
    blocks: Sequence[nn.Module], example: torch.Tensor, repeats: int = 7, threads: int = 1
) -> list[float]:
    """Seconds per block on its real input: the fastest of ``repeats`` interleaved rounds.

    The minimum, not the median: on a shared machine interference only ever adds time, and rounds
    interleave the blocks so a burst of it does not land on one block alone. ``threads`` matches the
    serving instances' intra-op threads, since blocks scale differently with threads.
    """
    inputs = _block_inputs(blocks, example)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(max(threads, 1))
    best = [math.inf] * len(blocks)
    try:
        with torch.inference_mode():
            for block, x in zip(blocks, inputs, strict=True):
                block(x)  # warm-up: kernel selection and allocation
            for _ in range(repeats):
                for index, (block, x) in enumerate(zip(blocks, inputs, strict=True)):
                    start = time.perf_counter()
                    block(x)
                    best[index] = min(best[index], time.perf_counter() - start)
    finally:
        torch.set_num_threads(previous_threads)
    return best


def count_flops(blocks: Sequence[nn.Module], example: torch.Tensor) -> list[float]:
    """FLOPs per block as counted by ``torch.utils.flop_counter`` (matmuls and convolutions)."""
    costs = []
    with torch.inference_mode():
        for block, x in zip(blocks, _block_inputs(blocks, example), strict=True):
            counter = FlopCounterMode(display=False)
            with counter:
                block(x)
            costs.append(float(counter.get_total_flops()))
    return costs


def count_params(blocks: Sequence[nn.Module]) -> list[float]:
    return [float(sum(p.numel() for p in block.parameters())) for block in blocks]


def block_costs(
    blocks: Sequence[nn.Module], example: torch.Tensor, balance: str, threads: int = 1
) -> tuple[list[float], str]:
    """Per-block costs by ``balance``, falling back (latency → flops → params) when a method fails."""
    methods = COST_METHODS[COST_METHODS.index(balance) :]
    for method in methods:
        try:
            if method == "latency":
                costs = measure_latency(blocks, example, threads=threads)
            elif method == "flops":
                costs = count_flops(blocks, example)
            else:
                costs = count_params(blocks)
        except Exception as error:  # a block that cannot run alone: try the next measure
            log.warning("cost by %s failed (%s); falling back", method, error)
            continue
        if sum(costs) > 0 and all(math.isfinite(c) and c >= 0 for c in costs):
            return costs, method
        log.warning("cost by %s gave no usable numbers %s; falling back", method, costs)
    raise SpecError("split.balance", f"no way to cost the blocks (tried {', '.join(methods)})")


def balanced_cuts(costs: Sequence[float], num_stages: int) -> tuple[int, ...]:
    """Contiguous cut points minimising the most expensive stage (the pipeline's pace).

    Exact dynamic programme over (stages, prefix length); n is a few dozen blocks at most.
    """
    n = len(costs)
    if not 1 <= num_stages <= n:
        raise SpecError("split.stages", f"cannot cut {n} blocks into {num_stages} non-empty stages")
    prefix = np.concatenate([[0.0], np.cumsum(costs)])
    # best[k][i]: smallest possible max stage cost for the first i blocks in k stages; start[k][i]: cut
    best = np.full((num_stages + 1, n + 1), np.inf)
    start = np.zeros((num_stages + 1, n + 1), dtype=int)
    best[0][0] = 0.0
    for k in range(1, num_stages + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                value = max(best[k - 1][j], prefix[i] - prefix[j])
                if value < best[k][i]:
                    best[k][i], start[k][i] = value, j
    cuts, i = [], n
    for k in range(num_stages, 1, -1):
        i = int(start[k][i])
        cuts.append(i)
    return tuple(reversed(cuts))


def plan_split(
    model: nn.Module,
    example: torch.Tensor,
    num_stages: int,
    what: str,
    cut_points: Sequence[int] = (),
    balance: str = "latency",
    threads: int = 1,
) -> SplitPlan:
    """Choose the cuts: the given ``cut_points`` (checked against the model), else balanced by cost."""
    blocks = sequential_blocks(model, what)
    if num_stages > len(blocks):
        raise SpecError(f"{what}.stages", f"{num_stages} stages but the model has only {len(blocks)} blocks")
    if cut_points:
        if cut_points[-1] >= len(blocks):
            raise SpecError(
                f"{what}.cut_points", f"{list(cut_points)} must be below the number of blocks ({len(blocks)})"
            )
        return SplitPlan(tuple(cut_points), tuple(count_params(blocks)), "given")
    costs, method = block_costs(blocks, example, balance, threads)
    return SplitPlan(balanced_cuts(costs, num_stages), tuple(costs), method)


def split_blocks(model: nn.Module, plan: SplitPlan, what: str) -> list[nn.Sequential]:
    """The stages as ``nn.Sequential``s sharing the model's block objects (no weights are copied)."""
    blocks = sequential_blocks(model, what)
    return [nn.Sequential(*blocks[a:b]) for a, b in plan.stage_ranges()]
