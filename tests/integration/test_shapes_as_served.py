"""Shapes as served on the real server: a Conv1d+GRU factory over sequences of 10-200 frames, measured
by the shapes study of ``make perf`` at one length, at the lengths its sampler draws and padded to
bucket candidates. The report names the lengths sent, holds the formed batches per length and the
padding cost of each bucketed run, and both the one-length and the varied rates. No direction is
asserted between them (host noise can flip a small difference); short settings, no figure judged."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from perf.framework import StudyContext
from perf.profiles import get_profile
from perf.shape_study import SINGLE, ShapeStudy
from perf.study_spec import spec_families

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]
FACTORIES = Path(__file__).resolve().parents[1] / "data" / "own_factories"
ENTRY = {
    "name": "sequence", "source": {"python": "factories:sequence_gru", "path": str(FACTORIES)},
    "sample": "factories:sequence_sample", "max_batch_size": 8,
    "inputs": [{"name": "frames", "dtype": "fp32", "shape": [-1, 16], "max_shape": [200, 16]}],
    "outputs": [{"name": "state", "dtype": "fp32", "shape": [32]}],
}  # fmt: skip


def test_the_shapes_study_reports_formed_batches_per_length_and_padding(tmp_path: Path) -> None:
    spec = tmp_path / "models.yaml"
    spec.write_text(yaml.safe_dump({"models": [ENTRY]}, sort_keys=False))
    families = spec_families(spec, ["sequence"])
    profile = get_profile("smoke", perf_analyzer=False, families=("sequence",), spec_families=families)
    study = ShapeStudy()
    assert study.steps(profile) > 0  # a variable axis: the study runs
    report = study.run(StudyContext(profile, tmp_path, tmp_path / "work", spec))
    text = report.path.read_text()
    figures = json.loads((tmp_path / "shapes.json").read_text())["sequence"]
    runs = {run["name"]: run for run in figures["runs"]}
    assert {SINGLE, "exact lengths", "2 buckets"} <= set(runs), list(runs)
    assert all(run["failed"] == 0 and run["throughput"] > 0 for run in runs.values())
    # both rates are in the report; the one-length run is one row, the varied ones many
    assert runs[SINGLE]["throughput"] != runs["exact lengths"]["throughput"]
    single = re.search(r"every request at (\d+)", text)
    assert (
        single and len(runs[SINGLE]["rows"]) == 1 and runs[SINGLE]["rows"][0]["sent_length"] == int(single[1])
    )
    assert len(runs["exact lengths"]["rows"]) > 20  # the sampler's lengths, each its own shape
    # padded to two buckets: exactly two lengths sent, named in the per-length table, with a padding cost
    buckets = runs["2 buckets"]["buckets"]
    assert [row["sent_length"] for row in runs["2 buckets"]["rows"]] == buckets
    assert (
        runs["2 buckets"]["padding"]["ratio"] > 1.0 and 0 < runs["2 buckets"]["padding"]["padded_share"] < 1
    )
    assert f"buckets {buckets}" in text and "### 2 buckets: formed batches per length sent" in text
    for length in buckets:
        assert re.search(rf"^\| {length} \| \d+-{length} \| \d+ \|", text, re.MULTILINE), length
    assert figures["pick"] in runs and figures["pick"] != SINGLE
