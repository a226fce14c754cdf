"""The raw torch curve's fit is the compute profile ``make plan --compute-profile`` reads: a cost model
even when the timed batches fall with their size, as on a loaded host or a launch-bound GPU."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch

from exporters.resolve import load_spec
from gpucheck import raw, report
from gpucheck.grid import REHEARSAL
from gpucheck.repository import CheckModel
from perf.plan.compute_profile import read_compute_profile

ROOT = Path(__file__).resolve().parents[3]


def test_a_raw_curve_that_falls_with_the_batch_still_writes_a_profile_plan_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    falling = itertools.count()
    monkeypatch.setattr(raw, "_timed", lambda run, device: 10.0 - 0.01 * next(falling))
    spec = load_spec(ROOT / "models.yaml")
    curve = raw.raw_curve(
        CheckModel(spec.model("recommender"), "recommender", "fp32"), REHEARSAL, torch.device("cpu")
    )
    sizes = sorted(curve.batch_ms)
    assert [curve.batch_ms[s] for s in sizes] == sorted(curve.batch_ms.values(), reverse=True)
    assert curve.fit.t_ms > 0 and curve.fit.dt_ms == 0.0
    path = tmp_path / report.FIGURES
    path.write_text(json.dumps({"compute_profile": report.compute_profile("cpu", [curve])}))
    profile = read_compute_profile(path)
    assert profile.models["recommender"]["fp32"].dt_ms == 0.0
