"""The article's batching model ``T_batch(N) = T + (N-1)·Δt``, fitted by least squares to the compute
times per batch size the server reports (``T``: a batch of one; ``Δt``: each further sample)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from perf.errors import OptionError


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
    """Least-squares ``T`` and ``Δt`` from ``{batch size: ms}``, each point (and R²) weighted by
    ``weights``."""
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
