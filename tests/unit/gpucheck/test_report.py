"""The check's output without a machine: the compute profile (raw torch's fit per model and precision), a
report with failed and skipped steps that still renders and says so, and the checks the rehearsal
applies to what comes back (docs/GPU.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucheck import report
from gpucheck.grid import GPU
from gpucheck.raw import RawCurve
from gpucheck.rehearsal import validate
from perf.model.latency import fit_latency


def _curve(base: str, precision: str, points: dict[int, float]) -> RawCurve:
    return RawCurve(base, precision, "cpu", points, fit_latency(points))


def test_the_compute_profile_is_the_fit_of_raw_torch_per_model_and_precision() -> None:
    curves = [
        _curve("recommender", "fp32", {1: 1.0, 2: 1.5, 4: 2.5}),
        _curve("recommender", "fp16", {1: 0.5, 8: 4.0}),
    ]
    profile = report.compute_profile("NVIDIA H200", curves)
    assert profile["device"] == "NVIDIA H200" and "raw torch" in profile["source"]
    fp32 = profile["models"]["recommender"]["fp32"]
    assert fp32["T_ms"] == pytest.approx(1.0) and fp32["dt_ms"] == pytest.approx(0.5)
    assert fp32["batches"] == {"1": 1.0, "2": 1.5, "4": 2.5}
    assert set(profile["models"]["recommender"]) == {"fp32", "fp16"}


def _document(sections: dict) -> dict:
    from gpucheck.machine import MachineFacts

    facts = MachineFacts(
        "3.12.3", "2.11.0", "13.0", "2.5.2", "1.30.0", ["CPUExecutionProvider"], "NVIDIA H200", True
    )
    raw = {("recommender", "fp32"): _curve("recommender", "fp32", {1: 1.0, 2: 1.5})}
    return report.figures(GPU, facts, sections, raw, 12.0)


def test_a_report_with_failed_and_skipped_steps_still_renders_and_says_so(tmp_path: Path) -> None:
    sections = {
        "raw": {"status": "ok", "seconds": 1.0, "curves": []},
        "server": {"status": "failed", "error": "ServingError: recommender did not load", "seconds": 3.0},
        "latency": {"status": "skipped", "reason": "needs server, which did not run"},
    }
    report.write(tmp_path, _document(sections))
    text = (tmp_path / report.REPORT).read_text()
    assert "recommender did not load" in text and "Not measured: skipped." in text
    assert "TensorRT FP16 plans" in text and "onnxruntime's CUDA execution provider" in text
    problems = validate(tmp_path)
    assert any("server: failed" in p for p in problems) and any("latency: skipped" in p for p in problems)
    document = json.loads((tmp_path / report.FIGURES).read_text())
    assert document["compute_profile"]["models"]["recommender"]["fp32"]["batches"] == {"1": 1.0, "2": 1.5}


def test_validate_refuses_more_files_than_come_back_and_a_malformed_profile(tmp_path: Path) -> None:
    report.write(tmp_path, _document({"raw": {"status": "ok", "seconds": 1.0}}))
    assert validate(tmp_path) == []
    figures = json.loads((tmp_path / report.FIGURES).read_text())
    del figures["compute_profile"]["models"]["recommender"]["fp32"]["dt_ms"]
    (tmp_path / report.FIGURES).write_text(json.dumps(figures))
    for extra in range(4):
        (tmp_path / f"extra{extra}.txt").write_text("x")
    problems = validate(tmp_path)
    assert any("the device tool brings back 8" in p for p in problems)
    assert any("models.recommender.fp32.dt_ms: Field required" in p for p in problems)
