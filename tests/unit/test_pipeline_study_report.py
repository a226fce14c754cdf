"""The pipeline study's report from given figures (no server): ratios, per-boundary latency, goals."""

from __future__ import annotations

import json
from pathlib import Path

from perf.pipeline_study import PLANS, REC, Row, write_pipeline_report

RECORD = {
    "boundary_bytes_per_request": 512,
    "boundary_bytes_saved_per_request": 512,
    "compression_max_rel_error": 1e-4,
}


def _fixed(p50: float, failed: int = 0) -> dict[str, float]:
    return {"p50_ms": p50, "p99_ms": 2 * p50, "failed": failed, "sent": 100}


def _row(pipeline_qps: float, pipeline_p50: float) -> Row:
    """The recommender pipeline against a monolithic model at 200 inf/s and p50 2 ms."""
    return Row(
        REC[0],
        {"model": 200.0, "pipeline": pipeline_qps},
        {"model": _fixed(2.0), "pipeline": _fixed(pipeline_p50)},
        [],
        RECORD,
    )


def test_report_states_ratios_added_latency_and_goals(tmp_path: Path) -> None:
    row = _row(190.0, 2.3)
    live = {"failed": 0, "sent": 50, "updates_applied": 10, "dense_swapped": 1.0}
    text = write_pipeline_report(tmp_path, PLANS["quick"], [row], live).read_text()
    assert "| 0.95 |" in text and "+0.30" in text and "512 (512)" in text
    assert "≥ 0.9× recommender | 0.95× | met" in text
    assert "≤ 0.5 ms | +0.30 ms | met" in text
    assert "0/50 failed; 10 updates applied, dense v2 live | met" in text
    assert json.loads((tmp_path / "pipeline.json").read_text())["live"] == live


def test_missed_goals_and_an_incomplete_live_phase_are_said(tmp_path: Path) -> None:
    row = _row(100.0, 4.0)
    live = {"failed": 0, "sent": 50, "updates_applied": 0, "dense_swapped": 0.0}
    text = write_pipeline_report(tmp_path, PLANS["quick"], [row], live).read_text()
    assert "0.50× | MISSED" in text and "+2.00 ms | MISSED" in text and "n/a (incomplete)" in text
