"""Figures from records over a span: a request belongs to the span its response arrived in; throughput
counts successful samples; latencies are per sample, from arrival.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from perf.measure.records import Record, latencies


@dataclass(frozen=True)
class Summary:
    requests: int  # requests whose outcome fell in the span
    succeeded: int
    failed: int
    samples: int  # successful samples
    seconds: float
    throughput: float  # successful samples per second
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float


def in_span(records: Sequence[Record], start_s: float, end_s: float) -> list[Record]:
    return [r for r in records if start_s <= r.recv_s < end_s]


def summarize(records: Sequence[Record], start_s: float, end_s: float) -> Summary:
    """Summarize the records answered in ``[start_s, end_s)``."""
    chosen = in_span(records, start_s, end_s)
    ok = [r for r in chosen if r.ok]
    lat_ms = latencies(ok) * 1e3
    p50, p90, p99 = np.percentile(lat_ms, [50, 90, 99]) if lat_ms.size else (np.nan, np.nan, np.nan)
    seconds = float(end_s - start_s)
    samples = sum(r.batch for r in ok)
    return Summary(
        requests=len(chosen), succeeded=len(ok), failed=len(chosen) - len(ok), samples=samples,
        seconds=seconds, throughput=samples / seconds if seconds > 0 else 0.0,
        p50_ms=float(p50), p90_ms=float(p90), p99_ms=float(p99),
        mean_ms=float(lat_ms.mean()) if lat_ms.size else float("nan"),
    )  # fmt: skip


def window_is_stable(values: Sequence[float], tolerance: float) -> bool:
    """perf_analyzer's rule (``--stability-percentage``): largest over smallest within ``1 + tolerance``."""
    if not values or any(np.isnan(v) for v in values):
        return False
    smallest = min(values)
    return smallest > 0 and max(values) <= (1 + tolerance) * smallest
