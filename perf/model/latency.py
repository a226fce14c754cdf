"""The article's batching model ``T_batch(N) = T + (N-1)·Δt``, fitted by least squares to the compute
times per batch size the server reports (``T``: a batch of one; ``Δt``: each further sample), and the
costs beyond compute that the server does not report (the Python backend's IPC per execution, frontend
work per request, the client's own cycles), calibrated from figures a measurement hands in."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from perf.errors import OptionError
from perf.model.batcher import BatcherConfig, ServiceModel, simulate
from perf.model.cpu import CpuModel


@dataclass(frozen=True)
class LatencyFit:
    t_ms: float  # T: one batch of one
    dt_ms: float  # Δt: each further sample
    r2: float
    points: dict[int, float]  # batch size -> measured ms (what was fitted)

    @property
    def flaw(self) -> str | None:
        """Why this fit is not a cost model (None: it is): a T or Δt below zero, which no batch costs."""
        if self.t_ms < 0:
            return (
                "the fit's T (a batch of one) came out negative: the times per batch size do not extend "
                "to batch 1 as T + (N−1)·Δt"
            )
        if self.dt_ms < 0:
            return "the fit's Δt came out negative: the time per batch fell as batches grew (noise)"
        return None

    def batch_ms(self, batch: float) -> float:
        return self.t_ms + (batch - 1) * self.dt_ms

    def throughput(self, batch: float) -> float:
        """Samples per second of one instance running batches of ``batch`` back to back."""
        return 1000 * batch / self.batch_ms(batch)

    def throughput_for(self, formed: Mapping[int, int]) -> float:
        """Samples per second of one busy instance running the formed-batch histogram ``formed``."""
        samples = sum(size * count for size, count in formed.items())
        busy_ms = sum(self.batch_ms(size) * count for size, count in formed.items())
        return 1000 * samples / busy_ms if busy_ms else 0.0


def fit_latency(points: Mapping[int, float], weights: Mapping[int, float] | None = None) -> LatencyFit:
    """Least-squares ``T`` and ``Δt`` from ``{batch size: ms}``, points and R² weighted by ``weights``."""
    sizes = sorted(points)
    if len(sizes) < 2:
        raise OptionError(f"need at least two batch sizes to fit, got {sizes}")
    n = np.asarray(sizes, dtype=float)
    y = np.asarray([points[s] for s in sizes], dtype=float)
    w = np.asarray([weights[s] for s in sizes] if weights else np.ones_like(n), dtype=float)
    design = np.stack([np.ones_like(n), n - 1], axis=1)
    root = np.sqrt(w)
    (t, dt), *_ = np.linalg.lstsq(design * root[:, None], y * root, rcond=None)
    predicted = design @ np.array([t, dt])
    mean = np.average(y, weights=w)
    total = float(np.sum(w * (y - mean) ** 2))
    r2 = 1.0 - float(np.sum(w * (y - predicted) ** 2)) / total if total > 0 else 1.0
    return LatencyFit(float(t), float(dt), r2, {s: float(points[s]) for s in sizes})


def fit_compute(compute_ms: dict[int, float], executions: dict[int, int]) -> LatencyFit:
    """``T + (N-1)·Δt`` over the formed sizes, weighted by their executions; one size gives a slope of 0, and
    a fit that is no cost (from sizes that scatter) gives way to the line through the smallest and largest."""
    if len(compute_ms) == 1:
        ((_, ms),) = compute_ms.items()
        return LatencyFit(ms, 0.0, 1.0, dict(compute_ms))
    fit = fit_latency(compute_ms, executions)
    if fit.t_ms > 0 and fit.dt_ms >= 0:
        return fit
    small, large = min(compute_ms), max(compute_ms)
    dt = max(0.0, (compute_ms[large] - compute_ms[small]) / (large - small))
    t = compute_ms[small] - (small - 1) * dt
    t, dt = (t, dt) if t > 0 else (compute_ms[small], 0.0)
    return LatencyFit(t, dt, fit.r2, dict(compute_ms))


def busy_per_batch_ms(mean_batch: float, served_per_s: float, instances: int) -> float:
    """Instance ms per execution of a run the server fell behind on: every instance was always busy."""
    return 1e3 * instances * mean_batch / served_per_s if served_per_s > 0 else 0.0


def per_batch_and_request_ms(
    single: tuple[float, float], batched: tuple[float, float], fit: LatencyFit
) -> tuple[float, float]:
    """(per-batch ms, per-request ms) beyond the fitted compute that make the simulated capacity equal the
    measured one without (``single``) and with batching (``batched``): two saturated runs, two unknowns,
    negative solutions clipped to 0."""
    (b1, busy1), (b2, busy2) = single, batched
    extra1, extra2 = busy1 - fit.batch_ms(b1), busy2 - fit.batch_ms(b2)
    if b2 - b1 < 0.5:  # the batched run formed no real batches: one equation, put it all per request
        return 0.0, max(0.0, extra2 / max(b2, 1.0))
    per_request = (extra2 - extra1) / (b2 - b1)
    per_batch = extra1 - b1 * per_request
    if per_request < 0:
        return max(0.0, extra1), 0.0
    if per_batch < 0:
        return 0.0, max(0.0, extra2 / b2)
    return per_batch, per_request


def slice_for(
    arrivals: np.ndarray, config: BatcherConfig, service: ServiceModel, cpu: CpuModel, target_p99_ms: float
) -> float:
    """The CPU wait's slice that makes the simulated p99 of ``arrivals`` equal ``target_p99_ms``, by bisection
    (with the draws fixed the p99 grows with the slice); 0 where the simulation alone reaches it."""

    def p99(slice_s: float) -> float:
        model = dataclasses.replace(service, cpu=dataclasses.replace(cpu, slice_s=slice_s))
        return simulate(arrivals, config, model).p99_ms()

    if p99(0.0) >= target_p99_ms:
        return 0.0
    low, high = 0.0, 0.05
    for _ in range(30):
        middle = (low + high) / 2
        low, high = (middle, high) if p99(middle) < target_p99_ms else (low, middle)
    return (low + high) / 2
