"""Raw torch on the device, in this process: the physical reference for every served figure and the compute
profile ``make plan --compute-profile`` reads."""

from __future__ import annotations

import functools
import logging
import statistics
from dataclasses import dataclass

import torch

from client.infer import timed_calls
from exporters.sources.inputs import draw_inputs
from gpucheck.grid import Grid
from gpucheck.repository import CheckModel, torch_module
from perf.model.latency import LatencyFit, fit_compute

log = logging.getLogger(__name__)
MIB = 1 << 20


@dataclass(frozen=True)
class RawCurve:
    base: str
    precision: str
    device: str
    batch_ms: dict[int, float]  # median ms of one forward
    fit: LatencyFit
    weights_mib: float | None = None  # allocator bytes the weights took (GPU only)
    peak_mib: float | None = None  # allocator peak of one forward at the largest batch, weights included


def _timed(run, device: torch.device) -> float:
    """Milliseconds of one ``run()``: CUDA events on a GPU, the wall clock elsewhere."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    return timed_calls(run, 1, warmup=0)[0]


def raw_curve(model: CheckModel, grid: Grid, device: torch.device) -> RawCurve:
    """Time ``model``'s eager module at every batch, with as many CPU threads as a served instance runs."""
    threads = torch.get_num_threads()
    if device.type == "cpu" and model.spec.threads.intra_op > 0:  # as many as a served instance runs
        torch.set_num_threads(model.spec.threads.intra_op)
    try:
        return _curve(model, grid, device)
    finally:
        torch.set_num_threads(threads)


def _curve(model: CheckModel, grid: Grid, device: torch.device) -> RawCurve:
    on_gpu = device.type == "cuda"
    if on_gpu:
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated(device)
    module = torch_module(model).to(device)
    weights = (torch.cuda.memory_allocated(device) - base) / MIB if on_gpu else None
    largest = [torch.from_numpy(a).to(device) for a in draw_inputs(model.spec, grid.max_batch, 3)]
    batch_ms: dict[int, float] = {}
    peak = None
    with torch.inference_mode():
        for batch in grid.batches:
            forward = functools.partial(module, *(t[:batch] for t in largest))
            for _ in range(grid.raw_warmup):
                forward()
            if on_gpu and batch == grid.max_batch:
                torch.cuda.synchronize(device)
                torch.cuda.reset_peak_memory_stats(device)
                forward()
                torch.cuda.synchronize(device)
                peak = (torch.cuda.max_memory_allocated(device) - base) / MIB
            batch_ms[batch] = statistics.median(_timed(forward, device) for _ in range(grid.raw_repeats))
    del module, largest
    if on_gpu:
        torch.cuda.empty_cache()
    # A cost model, never a negative Δt: times flat in the batch (a launch-bound GPU, a loaded host) can
    # fall by noise, and the compute profile ``make plan`` reads refuses a negative slope.
    fit = fit_compute(batch_ms, dict.fromkeys(batch_ms, 1))
    log.info(
        "raw %s %s on %s: T %.3f ms, Δt %.4f ms", model.base, model.precision, device, fit.t_ms, fit.dt_ms
    )
    return RawCurve(model.base, model.precision, str(device), batch_ms, fit, weights, peak)
