"""Cut an ordered sequence of blocks into K contiguous stages of balanced cost (pure torch, no I/O): a
pipeline runs at the pace of its slowest stage. Latency is measured per block on its real input, as
proxies mislead (a CNN's stem has few parameters but the highest resolution); FLOPs, then parameter
counts, are the fallbacks. Cuts within the timing's own noise of the best are taken by a key timing
cannot move (``steady_cuts``), so a fresh build does not get another pipeline by chance."""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from exporters.errors import SpecError

log = logging.getLogger(__name__)

COST_METHODS = ("latency", "flops", "params")  # a balance falls back to the methods after it
# The least timing noise a latency balance assumes: one build's rounds miss what varies between
# processes (allocation, frequency, cache placement).
MIN_LATENCY_NOISE = 0.03
RECORDED_NEAR_CUTS = 16  # how many near cuts a plan records: enough to read the choice, not all of them


def stage_sums(costs: Sequence[float], cuts: Sequence[int]) -> tuple[float, ...]:
    """The cost of each stage, by the prefix sums ``balanced_cuts`` compares (the same rounding)."""
    prefix = _prefix(costs)
    return tuple(float(prefix[b] - prefix[a]) for a, b in itertools.pairwise([0, *cuts, len(costs)]))


@dataclass(frozen=True)
class SplitPlan:
    """Where the stages start and why: ``cuts[k]`` is the index of the first block of stage ``k + 1``."""

    cuts: tuple[int, ...]
    block_costs: tuple[float, ...]
    cost_method: str  # latency | flops | params | given
    noise: float = 0.0  # relative: slowest stages closer than this to the best cannot be told apart
    near_cuts: tuple[tuple[int, ...], ...] = ()  # the cuts within that noise of the best, chosen first
    tie_method: str = ""  # what chose among near_cuts: flops | params | earliest ("" without noise)
    reason: str = ""  # why these cuts, in words

    def stage_ranges(self) -> list[tuple[int, int]]:
        return list(itertools.pairwise([0, *self.cuts, len(self.block_costs)]))


@dataclass(frozen=True)
class BlockCosts:
    """Per-block costs, how they were obtained, and their relative noise (0 for counted costs)."""

    values: list[float]
    method: str
    noise: float = 0.0


def sequential_blocks(model: nn.Module, what: str) -> list[nn.Module]:
    """The ordered blocks of an ``nn.Sequential``; anything else cannot be cut at block boundaries."""
    if not isinstance(model, nn.Sequential) or len(model) == 0:
        raise SpecError(
            f"{what}.split", f"blocks needs an nn.Sequential of blocks, got {type(model).__name__}"
        )
    return list(model)


def _block_inputs(blocks: Sequence[nn.Module], example: torch.Tensor) -> list[torch.Tensor]:
    inputs, x = [], example
    with torch.inference_mode():
        for block in blocks:
            inputs.append(x)
            x = block(x)
    return inputs


def measure_latency(
    blocks: Sequence[nn.Module], example: torch.Tensor, repeats: int = 7, threads: int = 1
) -> tuple[list[float], float]:
    """Seconds per block on its real input (the fastest of ``repeats`` interleaved rounds: interference
    only adds time), and their relative noise, ``sum(median rounds) / sum(fastest rounds) - 1`` over the
    whole model (one block's few rounds cannot estimate its own). ``threads``: the serving instances'."""
    inputs = _block_inputs(blocks, example)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(max(threads, 1))
    rounds = np.full((max(repeats, 1), len(blocks)), math.inf)
    try:
        with torch.inference_mode():
            for block, x in zip(blocks, inputs, strict=True):
                block(x)  # warm-up: kernel selection and allocation
            for row in rounds:
                for index, (block, x) in enumerate(zip(blocks, inputs, strict=True)):
                    start = time.perf_counter()
                    block(x)
                    row[index] = time.perf_counter() - start
    finally:
        torch.set_num_threads(previous_threads)
    fastest = rounds.min(axis=0)
    noise = float(np.median(rounds, axis=0).sum() / fastest.sum() - 1.0) if fastest.sum() > 0 else 0.0
    return fastest.tolist(), noise


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
) -> BlockCosts:
    """Per-block costs by ``balance``, falling back (latency → flops → params) when a method fails."""
    methods = COST_METHODS[COST_METHODS.index(balance) :]
    for method in methods:
        noise = 0.0
        try:
            if method == "latency":
                costs, measured = measure_latency(blocks, example, threads=threads)
                noise = max(measured, MIN_LATENCY_NOISE)
            elif method == "flops":
                costs = count_flops(blocks, example)
            else:
                costs = count_params(blocks)
        except Exception as error:  # a block that cannot run alone: try the next measure
            log.warning("cost by %s failed (%s); falling back", method, error)
            continue
        if sum(costs) > 0 and all(math.isfinite(c) and c >= 0 for c in costs):
            return BlockCosts(costs, method, noise)
        log.warning("cost by %s gave no usable numbers %s; falling back", method, costs)
    raise SpecError("split.balance", f"no way to cost the blocks (tried {', '.join(methods)})")


def _prefix(costs: Sequence[float]) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(costs, dtype=float)])


def balanced_cuts(
    costs: Sequence[float], num_stages: int, within: tuple[Sequence[float], float] | None = None
) -> tuple[int, ...]:
    """Contiguous cut points minimising the most expensive stage, by an exact dynamic programme;
    ``within=(other, limit)`` admits only cuts none of whose stages costs more than ``limit`` by ``other``."""
    n = len(costs)
    if not 1 <= num_stages <= n:
        raise SpecError("split.stages", f"cannot cut {n} blocks into {num_stages} non-empty stages")
    prefix = _prefix(costs)
    bound, limit = (_prefix(within[0]), within[1]) if within is not None else (prefix, math.inf)
    # best[k][i]: smallest possible max stage cost for the first i blocks in k stages; start[k][i]: cut
    best = np.full((num_stages + 1, n + 1), np.inf)
    start = np.zeros((num_stages + 1, n + 1), dtype=int)
    best[0][0] = 0.0
    for k in range(1, num_stages + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                value = max(best[k - 1][j], prefix[i] - prefix[j])
                if value < best[k][i] and bound[i] - bound[j] <= limit:
                    best[k][i], start[k][i] = value, j
    if not math.isfinite(best[num_stages][n]):
        raise SpecError("split.stages", f"no cut into {num_stages} stages has every stage within {limit:g}")
    cuts, i = [], n
    for k in range(num_stages, 1, -1):
        i = int(start[k][i])
        cuts.append(i)
    return tuple(reversed(cuts))


def cuts_within(costs: Sequence[float], num_stages: int, limit: float) -> Iterator[tuple[int, ...]]:
    """The cuts into ``num_stages`` stages none of which costs more than ``limit``, depth first (a
    generator: a loose limit admits combinatorially many)."""
    prefix, n = _prefix(costs), len(costs)

    def extend(cuts: tuple[int, ...], start: int, left: int) -> Iterator[tuple[int, ...]]:
        if left == 1:
            if prefix[n] - prefix[start] <= limit:
                yield cuts
            return
        for stop in range(start + 1, n - left + 2):
            if prefix[stop] - prefix[start] > limit:
                break
            yield from extend((*cuts, stop), stop, left - 1)

    return extend((), 0, num_stages)


def steady_cuts(costs: BlockCosts, num_stages: int, tie_costs: BlockCosts | None) -> SplitPlan:
    """The balanced cuts; among those within ``costs.noise`` of the best slowest stage (as good as the
    timing can tell), the best balance of ``tie_costs`` (counted, not timed), else the first found."""
    best = balanced_cuts(costs.values, num_stages)
    limit = max(stage_sums(costs.values, best)) * (1 + costs.noise)
    tie = tie_costs.values if tie_costs is not None else [0.0] * len(costs.values)
    chosen = balanced_cuts(tie, num_stages, within=(costs.values, limit)) if costs.noise else best
    near = list(itertools.islice(cuts_within(costs.values, num_stages, limit), RECORDED_NEAR_CUTS + 1))
    more = len(near) > RECORDED_NEAR_CUTS
    near = [chosen, *(c for c in near[:RECORDED_NEAR_CUTS] if c != chosen)][:RECORDED_NEAR_CUTS]
    tie_method = "" if not costs.noise else tie_costs.method if tie_costs is not None else "earliest"
    reason = _reason(costs, best, tuple(near), more, tie_method)
    return SplitPlan(chosen, tuple(costs.values), costs.method, costs.noise, tuple(near), tie_method, reason)


def _reason(
    costs: BlockCosts, best: tuple[int, ...], near: tuple[tuple[int, ...], ...], more: bool, tie_method: str
) -> str:
    """Why ``near[0]`` was taken, in words, for ``pipeline.json`` and the build log."""
    chosen = near[0]
    if len(near) == 1 or not costs.noise:
        clear = f", clear of every other cut by more than its {costs.noise:.1%} noise" if costs.noise else ""
        return f"the best slowest stage by {costs.method}{clear}"
    count = f"more than {len(near)}" if more else str(len(near))
    listed = ", ".join(str(list(c)) for c in near) + (", …" if more else "")
    how = "first found" if tie_method == "earliest" else f"best balance of {tie_method}"
    fastest = "" if chosen == best else f"; the fastest measured was {list(best)}"
    return (
        f"{count} cuts within the {costs.noise:.1%} noise of the best slowest stage by {costs.method} "
        f"({listed}): {list(chosen)} has the {how}{fastest}"
    )


def _tie_costs(blocks: Sequence[nn.Module], example: torch.Tensor, costs: BlockCosts) -> BlockCosts | None:
    """FLOPs (or parameters) to settle cuts that measured latency cannot tell apart."""
    if costs.method != "latency":
        return None
    try:
        return block_costs(blocks, example, "flops")
    except SpecError:  # nothing to count: the earliest of the near cuts
        return None


def plan_split(
    model: nn.Module, example: torch.Tensor, num_stages: int, what: str, cut_points: Sequence[int] = (),
    balance: str = "latency", threads: int = 1,
) -> SplitPlan:  # fmt: skip
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
    costs = block_costs(blocks, example, balance, threads)
    plan = steady_cuts(costs, num_stages, _tie_costs(blocks, example, costs))
    log.info("%s: cuts %s by %s: %s", what, list(plan.cuts), plan.cost_method, plan.reason)
    return plan


def split_blocks(model: nn.Module, plan: SplitPlan, what: str) -> list[nn.Sequential]:
    """The stages as ``nn.Sequential``s sharing the model's block objects (no weights are copied)."""
    blocks = sequential_blocks(model, what)
    return [nn.Sequential(*blocks[a:b]) for a, b in plan.stage_ranges()]
