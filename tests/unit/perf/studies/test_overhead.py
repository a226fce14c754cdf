"""Serving overhead per execution (``perf.studies.analysis``) from server statistics and raw points,
without a server: the arithmetic, and every way a figure cannot be measured."""

from __future__ import annotations

import math

import pytest

from client.stats import BatchBucket
from perf.markdown import UNMEASURED
from perf.measure.raw import RawPoint
from perf.studies.analysis import at_raw_sizes, overhead_cell, overhead_of, raw_ms_at

RAW = [RawPoint(16, 2.0, 8000.0, 0.1), RawPoint(1, 0.5, 2000.0, 0.5)]  # out of order on purpose


def _bucket(executions: int, ms_each: float) -> BatchBucket:
    return BatchBucket(executions, round(executions * ms_each * 1e6))


def test_raw_is_exact_at_measured_sizes_linear_between_and_never_extrapolated() -> None:
    assert raw_ms_at(RAW, 1) == 0.5 and raw_ms_at(RAW, 16) == 2.0
    assert raw_ms_at(RAW, 8) == pytest.approx(0.5 + 7 / 15 * 1.5)
    assert raw_ms_at(RAW, 32) is None and raw_ms_at([], 1) is None


def test_overhead_is_served_minus_raw_per_execution_over_the_formed_sizes() -> None:
    batches = {1: _bucket(10, 2.0), 8: _bucket(5, 3.0)}
    overhead = overhead_of(batches, RAW)
    raw_at_8 = 0.5 + 7 / 15 * 1.5
    assert overhead.executions == 15 and overhead.batch == pytest.approx((10 * 1 + 5 * 8) / 15)
    assert overhead.served_ms == pytest.approx((10 * 2.0 + 5 * 3.0) / 15)
    assert overhead.raw_ms == pytest.approx((10 * 0.5 + 5 * raw_at_8) / 15)
    assert overhead.ms == pytest.approx(overhead.served_ms - overhead.raw_ms)
    assert overhead.ratio == pytest.approx(overhead.served_ms / overhead.raw_ms)
    assert not overhead.why and overhead_cell(overhead) == f"{overhead.ms:.3f}"


@pytest.mark.parametrize(
    ("batches", "raw", "reason"),
    [
        ({1: _bucket(4, 0.2)}, RAW, "served compute 0.200 ms is below raw onnxruntime's 0.500 ms"),
        ({32: _bucket(4, 9.0)}, RAW, "batch 32 is outside the raw batch sizes (1–16)"),
        ({1: _bucket(4, 1.0)}, [], "raw onnxruntime was not timed"),
        ({}, RAW, "the server ran no execution in the measured windows"),
        ({1: _bucket(4, 1.0)}, [RawPoint(1, math.nan, 0.0, 0.0)], "is not a number"),
    ],
)
def test_what_cannot_be_measured_says_why_and_shows_no_number(batches, raw, reason: str) -> None:
    overhead = overhead_of(batches, raw)
    assert reason in overhead.why
    cell = overhead_cell(overhead)
    assert cell.startswith(f"{UNMEASURED} (") and reason in cell
    assert overhead_cell(None) == f"{UNMEASURED} (no server statistics)"


def test_per_batch_figures_only_at_raw_sizes_seen_often_enough() -> None:
    batches = {1: _bucket(50, 1.0), 3: _bucket(50, 1.5), 16: _bucket(4, 4.0)}
    (only,) = at_raw_sizes(batches, RAW)  # 3 was not timed raw, 16 seen 4 times (5: MIN_EXECUTIONS)
    assert only.batch == 1 and only.executions == 50 and only.ms == pytest.approx(0.5)
