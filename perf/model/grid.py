"""The candidate configurations a search ranks: delays × max batch sizes × instance counts."""

from __future__ import annotations

from dataclasses import dataclass

from perf.model.batcher import BatcherConfig

MAX_BATCH = 32  # the largest batch the studies build and the tuner's default grid considers


@dataclass(frozen=True)
class Grid:
    delays_us: tuple[int, ...] = (0, 500, 1000, 2000, 5000)
    max_batches: tuple[int, ...] = (8, MAX_BATCH)
    instances: tuple[int, ...] = (1, 2)
    preferred: tuple[tuple[int, ...], ...] = ((),)  # preferred-size sets tried (filtered to < max)
    no_batching: bool = True  # the baseline: one request per execution, per instance count

    def candidates(self, budget_ms: float) -> list[BatcherConfig]:
        """Every combination whose delay leaves room in the budget (a delay >= budget cannot meet it)."""
        out: list[BatcherConfig] = []
        for instances in self.instances:
            if self.no_batching:
                out.append(BatcherConfig(1, 0, instances=instances))
            for size in self.max_batches:
                for delay in self.delays_us:
                    if delay / 1000 >= budget_ms:
                        continue
                    for preferred in self.preferred:
                        kept = tuple(p for p in preferred if p < size)
                        config = BatcherConfig(size, delay, kept, instances)
                        if config not in out:
                            out.append(config)
        return out

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
    if not chosen.batching:
        return []
    delays = sorted(grid.delays_us)
    index = delays.index(chosen.max_queue_delay_us) if chosen.max_queue_delay_us in delays else -1
    picks = [delays[i] for i in (index - 1, index + 1) if 0 <= i < len(delays) and index >= 0]
    return [
        BatcherConfig(chosen.max_batch_size, d, chosen.preferred_batch_sizes, chosen.instances) for d in picks
    ]
