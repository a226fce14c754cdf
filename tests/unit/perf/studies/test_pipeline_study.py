"""The pipeline study without a server: its report from given figures (ratios, per-boundary latency,
goals), its per-step arithmetic from server statistics, and which comparisons a profile runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from client.stats import ModelStats
from exporters.errors import SpecError
from exporters.pipelines.build import BoundaryRecord, PipelineRecord
from perf.errors import OptionError, StudyError
from perf.measure.records import Summary
from perf.measure.server_view import ServerDelta
from perf.studies.framework import StudyContext
from perf.studies.pipeline_study import (
    Live,
    PipelineStudy,
    Row,
    Step,
    fixed_load,
    steps_of,
    study_spec,
    write_pipeline_report,
)
from perf.studies.profiles import get_profile
from perf.studies.study_spec import COMPARISONS
from tests.unit.exporters.schema.test_bounded_yaml import laughs, written

RECORD = PipelineRecord(
    content_hash="x", pipeline="recommender_pipeline", model="recommender", split="embedding_dense",
    stages=(), split_plan=None, boundary_dtype="fp16",
    boundaries=(BoundaryRecord("embedded", "fp16", (256,), 512, 1024),),
    split_max_rel_error=0.0, compression_max_rel_error=1e-4, artifact_max_rel_error=1e-4,
)  # fmt: skip


def _fixed(p50: float, failed: int = 0) -> Summary:
    return Summary(
        requests=100, succeeded=100 - failed, failed=failed, samples=100 - failed, seconds=1.0,
        throughput=100.0, p50_ms=p50, p90_ms=1.5 * p50, p99_ms=2 * p50, mean_ms=p50,
    )  # fmt: skip


def _row(pipeline_qps: float, pipeline_p50: float) -> Row:
    """The recommender pipeline against a monolithic model at 200 inf/s and p50 2 ms."""
    steps = [Step("recommender_pipeline_embedding", 0.1, 0.4, 3.0)]
    comparison = COMPARISONS["recommender_pipeline"]
    return Row(comparison, 200.0, pipeline_qps, _fixed(2.0), _fixed(pipeline_p50), steps, RECORD)


def _report(tmp_path: Path, row: Row, live: Live) -> str:
    context = StudyContext(get_profile("quick"), tmp_path, tmp_path / "work")
    return write_pipeline_report(context, PipelineStudy(), [row], live).path.read_text()


def test_report_states_ratios_added_latency_and_goals(tmp_path: Path) -> None:
    live = Live(_fixed(1.0), updates_applied=10, dense_swapped=True)
    text = _report(tmp_path, _row(190.0, 2.3), live)
    assert "| 0.95 |" in text and "+0.30" in text and "512 (512)" in text and "1.0e-04" in text
    assert "| recommender_pipeline_embedding | 0.100 | 0.400 | 3.0 |" in text
    assert "≥ 0.9× recommender | 0.95× | **met**" in text
    assert "≤ 0.5 ms | +0.30 ms | **met**" in text
    assert "0/100 failed; 10 updates applied, dense v2 live | **met**" in text
    saved = json.loads((tmp_path / "pipeline.json").read_text())
    assert saved["live"]["updates_applied"] == 10 and saved["rows"][0]["saturation_pipeline"] == 190.0


def test_missed_goals_and_an_incomplete_live_phase_are_said(tmp_path: Path) -> None:
    live = Live(_fixed(1.0, failed=3), updates_applied=0, dense_swapped=False)
    text = _report(tmp_path, _row(100.0, 4.0), live)
    assert "0.50× | **MISSED**" in text and "+2.00 ms | **MISSED**" in text
    assert "3/100 failed" in text and "**n/a** | incomplete" in text


def test_failed_requests_during_a_complete_live_phase_miss_the_goal(tmp_path: Path) -> None:
    live = Live(_fixed(1.0, failed=1), updates_applied=10, dense_swapped=True)
    assert "1/100 failed; 10 updates applied, dense v2 live | **MISSED**" in _report(
        tmp_path, _row(190.0, 2.3), live
    )


def test_failures_that_were_shed_arrivals_are_told_apart(tmp_path: Path) -> None:
    live = Live(_fixed(1.0, failed=3), updates_applied=10, dense_swapped=True, shed=3)
    text = _report(tmp_path, _row(190.0, 2.3), live)
    assert "| **MISSED** | 3 of the 3 failed were arrivals shed by the client" in text
    assert "no request was refused by the server" in text


def test_steps_split_the_ensemble_time_into_stages_and_the_rest() -> None:
    stage = ModelStats(requests=10, queue_ns=2_000_000, compute_ns=10_000_000, inferences=20, executions=5)
    ensemble = ModelStats(requests=10, request_ns=10 * 2_000_000)
    delta = ServerDelta(1.0, ensemble, 0.0, 0.0, related={"stage0": stage})
    steps = steps_of(delta, ["stage0"])
    assert steps[0] == Step("stage0", 0.2, 1.0, 4.0)
    assert steps[1].step == "ensemble (between steps)" and steps[1].compute_ms == pytest.approx(0.8)
    assert math.isnan(steps[1].mean_batch)


def test_profiles_choose_comparisons_and_options_narrow_them() -> None:
    study = PipelineStudy()
    assert get_profile("smoke").pipelines == () and study.steps(get_profile("smoke")) == 0
    assert set(get_profile("default").pipelines) == set(COMPARISONS)
    only_rec = get_profile("default", families=("recommender",))
    assert only_rec.pipelines == ("recommender_pipeline", "recommender_pipeline_fp16b")
    # build, start, saturation + fixed load per model and per pipeline, and the live phase
    assert study.steps(only_rec) == 2 + 2 * 1 + 2 * 2 + 1
    assert get_profile("quick", poisson_fraction=0.3).pipeline_load_fraction == 0.3
    with pytest.raises(OptionError, match="unknown pipelines: nope"):
        get_profile("quick", pipelines=("nope",))


def test_no_capacity_is_a_clear_error_not_a_zero_rate(tmp_path: Path) -> None:
    context = StudyContext(get_profile("quick"), tmp_path, tmp_path)
    with pytest.raises(StudyError, match="recommender answered nothing at saturation"):
        fixed_load(context, "recommender", 0.0, seed_offset=1)
    assert fixed_load(context, "recommender", 400.0, seed_offset=1).rate == 200.0  # half the capacity


def test_the_studys_spec_is_read_within_the_bounds_of_every_spec(tmp_path: Path) -> None:
    """The study rereads the user's spec to add its variants: through the same bounded reader, so a
    spec whose aliases expand past the limit is refused here too, not built into memory."""
    wanted = [c for c in COMPARISONS.values() if c.model == "recommender"]
    with pytest.raises(SpecError, match="expands to"):
        study_spec(written(tmp_path, laughs(7)), wanted)
