"""What the check measures (``gpucheck.grid``): the GPU grid fits the lent machine's minutes; the
rehearsal's is tiny."""

from __future__ import annotations

from gpucheck.grid import GPU, REHEARSAL


def test_the_grids_fit_the_lent_machine() -> None:
    """The GPU grid measures batch 1…256 at concurrency 1/16/64 and 1, 2, 4 instances, stopping early
    enough to write its report inside the eight minutes the check has; the rehearsal is tiny."""
    assert GPU.batches[0] == 1 and GPU.max_batch == 256 and GPU.concurrencies == (1, 16, 64)
    assert GPU.instances == (1, 2, 4) and len(GPU.latency_models) == 4 and len(GPU.pipelines) == 2
    assert GPU.deadline_s < 8 * 60 - 60
    assert REHEARSAL.max_batch <= 8 and len(REHEARSAL.instances) >= 2
