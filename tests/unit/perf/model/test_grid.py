"""The candidate configurations a search ranks (``perf.model.grid``)."""

from __future__ import annotations

from perf.model.batcher import BatcherConfig
from perf.model.grid import Grid, neighbours


def test_the_grid_leaves_out_delays_the_budget_cannot_hold() -> None:
    grid = Grid(delays_us=(0, 1000, 5000), max_batches=(8,), instances=(1,))
    delays = {c.max_queue_delay_us for c in grid.candidates(budget_ms=4)}
    assert delays == {0, 1000}
    assert BatcherConfig(1) in grid.candidates(budget_ms=4)
    assert {c.max_queue_delay_us for c in neighbours(BatcherConfig(8, 1000), grid)} == {0, 5000}
