"""Figures from records: per-sample latency from arrival, spans by response time, errors counted."""

import dataclasses
import math

import numpy as np
import pytest

from perf.measure.records import Record, summarize, window_is_stable, write_csv
from tests import records_csv as records_module
from tests.records_csv import read_csv


def record(send, recv, batch=1, ok=True, arrivals=()):
    return Record("m", send, recv, batch, 4 * batch, 4 * batch, ok, "ok" if ok else "error", arrivals)


def test_static_batch_latency_counts_from_each_arrival():
    arrivals = tuple(0.1 * i for i in range(4))
    r = record(0.3, 0.5, batch=4, arrivals=arrivals)
    np.testing.assert_allclose(r.sample_latencies(), [0.5, 0.4, 0.3, 0.2])


def test_summary_counts_samples_and_failures_in_span():
    records = [
        record(0.0, 0.5),
        record(0.1, 0.9, batch=3),
        record(0.2, 0.95, ok=False),
        record(0.9, 1.5),  # answered after the span
    ]
    s = summarize(records, 0.0, 1.0)
    assert (s.requests, s.succeeded, s.failed, s.samples) == (3, 2, 1, 4)
    assert s.throughput == pytest.approx(4.0)
    latencies = [500, 800, 800, 800]
    assert s.mean_ms == pytest.approx(np.mean(latencies))
    assert s.p50_ms <= s.p90_ms <= s.p99_ms
    assert s.p99_ms == pytest.approx(np.percentile(latencies, 99))


def test_summary_of_nothing_is_nan_not_an_error():
    s = summarize([record(0, 1, ok=False)], 0, 2)
    assert s.samples == 0 and s.failed == 1 and math.isnan(s.p99_ms)


def test_stability_rule_is_perf_analyzers_largest_over_smallest():
    assert window_is_stable([100, 105, 96], 0.10)  # 105 / 96 = 1.094
    assert not window_is_stable([100, 105, 95], 0.10)  # 1.105: within 10% of the mean, but not agreed
    assert not window_is_stable([100, 130, 95], 0.10)
    assert not window_is_stable([math.nan, 100, 100], 0.10)
    assert not window_is_stable([0, 0, 0], 0.10)


def test_records_round_trip_through_csv(tmp_path):
    records = [record(0.0, 0.5, batch=2, arrivals=(0.0, 0.25)), record(0.1, 0.2, ok=False)]
    write_csv(records, tmp_path / "r.csv")
    again = read_csv(tmp_path / "r.csv")
    assert [(r.batch, r.ok, r.status) for r in again] == [(r.batch, r.ok, r.status) for r in records]
    np.testing.assert_allclose(again[0].sample_latencies(), records[0].sample_latencies(), atol=1e-6)


def test_reading_records_back_reads_the_record_fields_once_not_per_row(tmp_path, monkeypatch):
    write_csv([record(0.0, 0.1 * i) for i in range(1, 50)], tmp_path / "r.csv")
    calls = []
    monkeypatch.setattr(records_module, "fields", lambda cls: calls.append(cls) or dataclasses.fields(cls))
    assert len(read_csv(tmp_path / "r.csv")) == 49
    assert calls == []  # worked out at import, whatever the number of rows
