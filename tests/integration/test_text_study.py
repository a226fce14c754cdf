"""A smoke text-embedding study against the real server, through ``make perf``'s framework: tiny
windows, checks that the report is complete and its numbers add up. No speed is asserted."""

from __future__ import annotations

import json

import pytest

from perf.studies.framework import StudyContext
from perf.studies.profiles import get_profile
from perf.studies.study_spec import INT8
from perf.studies.study_spec import TEXT_MODES as MODE_PLANS
from perf.studies.text_study import TextStudy
from tests.records_csv import read_csv

# A hang guard, not a speed check: three times the study's setup on a loaded two-core host, which,
# with this file run alone, builds the shared repository before the study's own repository and server.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1000)]
MODES = ("none", "buckets", "longest")


@pytest.fixture(scope="module")
def study(tmp_path_factory, reuse_exports):
    folder = tmp_path_factory.mktemp("text-study")
    # The study builds into work/text_repository; the shared build's encoders save the exports.
    encoders = {MODE_PLANS[mode].spec().encoder_name: "text_embedding_encoder" for mode in MODES}
    encoders[INT8.spec().encoder_name] = "text_embedding_int8_encoder"
    reuse_exports(folder / "work" / "text_repository", encoders)
    profile = get_profile("smoke", text_modes=MODES, text_corpus=48, text_reference_texts=8)
    steps: list[str] = []
    report = TextStudy().run(StudyContext(profile, folder, folder / "work", progress=steps.append))
    return report, folder, json.loads((folder / "text_embedding.json").read_text()), steps


def test_report_has_every_part(study) -> None:
    report, folder, _, steps = study
    text = report.path.read_text()
    for heading in ("## Closed loop", "short queries only", "## Open loop", "long passages sharing",
                    "## References", "## Latency model per padded length", "## Goals"):  # fmt: skip
        assert heading in text, heading
    assert [g.name for g in report.goals] == [
        "text served vs raw", "text dynamic vs none", "text short-query p99 shared", "text int8 vs fp32"
    ]  # fmt: skip
    assert (folder / "text-server.log").stat().st_size > 0
    assert len(steps) == TextStudy().steps(get_profile("smoke", text_modes=MODES))


def test_every_request_is_recorded_and_succeeds(study) -> None:
    _, folder, figures, _ = study
    points = figures["points"]
    assert {(p["mode"], p["load"]) for p in points} >= {(m, "closed mixed") for m in (*MODES, "int8")}
    for point in points:
        assert point["failed"] == 0, point
    records = read_csv(folder / "text_records.csv")
    assert len(records) == sum(p["sent"] for p in points)


def test_batching_and_padding_are_what_each_mode_promises(study) -> None:
    _, _, figures, _ = study
    by = {(p["mode"], p["load"]): p for p in figures["points"]}
    none, buckets = by[("none", "closed mixed")], by[("buckets", "closed mixed")]
    # batch 1 only (a loaded host's short window can hold no execution of the encoder at all)
    assert set(none["formed"]) <= {"1"} and none["padding_waste"] == pytest.approx(1.0)
    assert buckets["padding_waste"] > 1.0  # rounded up to a bucket
    assert by[("longest", "closed mixed")]["padding_waste"] >= 1.0
    assert figures["sentence_transformers"] > 0 and all(v[1] > 0 for v in figures["raw"].values())
