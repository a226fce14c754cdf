"""The candidate configurations a search ranks: delays × max batch sizes × instance counts."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace

from perf.model.batcher import BatcherConfig

MAX_BATCH = 32  # the largest batch the studies build and the tuner's default grid considers


@dataclass(frozen=True)
class Grid:
    delays_us: tuple[int, ...] = (0, 500, 1000, 2000, 5000)
    max_batches: tuple[int, ...] = (8, MAX_BATCH)
    instances: tuple[int, ...] = (1, 2)
    preferred: tuple[tuple[int, ...], ...] = ((),)  # preferred-size sets tried (filtered to < max)
    no_batching: bool = True  # the baseline: one request per execution, per instance count

    def batch_sizes(
        self, budget_ms: float, compute_ms: Callable[[int], float] | None = None
    ) -> tuple[int, ...]:
        """The max batch sizes, each bounded so a full batch computes within the budget (none of 2: none)."""
        if compute_ms is None:
            return self.max_batches
        fitting = (
            max((n for n in range(1, size + 1) if compute_ms(n) <= budget_ms), default=1)
            for size in self.max_batches
        )
        return tuple(dict.fromkeys(n for n in fitting if n > 1))

    def candidates(
        self, budget_ms: float, compute_ms: Callable[[int], float] | None = None
    ) -> list[BatcherConfig]:
        """Every combination whose delay leaves room in the budget, with batch sizes whose compute fits it."""
        sizes = self.batch_sizes(budget_ms, compute_ms)
        delays = [delay for delay in self.delays_us if delay / 1000 < budget_ms]
        out: list[BatcherConfig] = []
        for instances in self.instances:
            if self.no_batching:
                out.append(BatcherConfig(1, 0, instances=instances))
            for size, delay, preferred in itertools.product(sizes, delays, self.preferred):
                out.append(BatcherConfig(size, delay, tuple(p for p in preferred if p < size), instances))
        return list(dict.fromkeys(out))  # preferred sets that differ only above a size are one candidate

    @property
    def largest_batch(self) -> int:
        return max(self.max_batches)


QUICK_GRID = Grid()
WIDE_GRID = Grid(
    delays_us=(0, 250, 500, 1000, 2000, 4000, 8000),
    max_batches=(4, 8, 16, MAX_BATCH),
    instances=(1, 2),
    preferred=((), (4, 8, 16)),
)


def neighbours(chosen: BatcherConfig, grid: Grid) -> list[BatcherConfig]:
    """The candidates one delay step below and above the chosen one (same batch size and instances)."""
    delays = sorted(grid.delays_us)
    if not chosen.batching or chosen.max_queue_delay_us not in delays:
        return []
    index = delays.index(chosen.max_queue_delay_us)
    picks = [delays[i] for i in (index - 1, index + 1) if 0 <= i < len(delays)]
    return [replace(chosen, max_queue_delay_us=delay) for delay in picks]
