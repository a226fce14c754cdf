"""perf_analyzer's profile export → our records, on exports captured from real perf_analyzer 2.41.0
runs (tests/data/README.md): the records must reproduce perf_analyzer's own CSV figure, and an open
loop's requests leave on our schedule."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from perf.errors import StudyError
from perf.measure.analyzer import read_analyzer_csv, read_export
from perf.measure.records import summarize
from perf.measure.target import Target

DATA = Path(__file__).resolve().parents[3] / "data"
CLOSED = DATA / "perf_analyzer_2.41.0_closed_c2.json"
OPEN = DATA / "perf_analyzer_2.41.0_open_300.json"


@pytest.fixture
def target() -> Target:
    inputs = {"dense": np.zeros((4, 16), np.float32), "sparse_ids": np.zeros((4, 8), np.int64)}
    return Target("recommender", "127.0.0.1:1", inputs, {"score": 4})


def throughput(records) -> float:
    return len(records) / (max(r.recv_s for r in records) - min(r.send_s for r in records))


def test_closed_loop_records_reproduce_perf_analyzers_own_csv(target: Target) -> None:
    raw = json.loads(CLOSED.read_text())["experiments"][0]["requests"]
    records, windows = read_export(CLOSED, target, "c2")
    assert len(records) == len(raw) and all(r.ok and r.batch == 1 for r in records)
    assert all(0 <= r.send_s < r.recv_s for r in records)
    assert [r.arrivals for r in records] == [(r.send_s,) for r in records]
    assert records[0].bytes_sent == 16 * 4 + 8 * 8 and records[0].bytes_received == 4
    assert len(windows) == 3 and windows[0][0] == 0.0
    assert all(a[1] == b[0] for a, b in itertools.pairwise(windows))  # back to back
    theirs = read_analyzer_csv(CLOSED.with_suffix(".csv"))
    assert summarize(records, windows[0][0], windows[-1][1]).throughput == pytest.approx(
        theirs.throughput, rel=0.03
    )
    ours = sorted(r.recv_s - r.send_s for r in records)
    expected = sorted((max(r["response_timestamps"]) - r["timestamp"]) / 1e9 for r in raw)
    assert ours == pytest.approx(expected, abs=2e-6)
    # perf_analyzer's p99 is one of the same latencies: the sorted (n·99 // 100)-th
    assert ours[len(ours) * 99 // 100 - 1] * 1e3 == pytest.approx(theirs.p99_ms, abs=0.002)


def test_open_loop_requests_leave_on_our_schedule(target: Target) -> None:
    arrivals = np.loadtxt(DATA / "perf_analyzer_2.41.0_open_arrivals.txt")
    records, _ = read_export(OPEN, target, "open")
    sends = np.array([r.send_s for r in records])
    assert np.all(np.diff(sends) >= 0) and len(records) == len(arrivals)
    assert np.abs(sends - arrivals).max() < 0.02  # sent on our schedule (the lag was ~1 ms)


def test_an_export_without_its_experiment_is_an_error(tmp_path: Path, target: Target) -> None:
    empty = tmp_path / "export.json"
    empty.write_text(json.dumps({"experiments": [], "version": "2.41.0"}))
    with pytest.raises(StudyError, match="expected one experiment"):
        read_export(empty, target, "empty")


def test_fp16_inputs_go_to_perf_analyzer_as_raw_bytes(tmp_path: Path) -> None:
    import base64

    from perf.measure.analyzer import write_input_data
    from perf.measure.target import Target

    pool = {"dense": np.arange(6, dtype=np.float16).reshape(2, 3), "ids": np.arange(4).reshape(2, 2)}
    target = Target("m", "127.0.0.1:1", pool, {"y": 4})
    data = json.loads(write_input_data(target, tmp_path / "inputs.json").read_text())["data"]
    assert len(data) == 2 and data[1]["ids"] == {"content": [2, 3], "shape": [2]}
    raw = base64.b64decode(data[1]["dense"]["content"]["b64"])
    assert np.frombuffer(raw, np.float16).tolist() == [3.0, 4.0, 5.0] and data[1]["dense"]["shape"] == [3]
