"""The batching study without a server (``perf.studies.study``): a failed perf_analyzer cross-check
does not lose the study, a sweep that measured nothing skips the open loop with a note, and ``make
perf`` runs the batching study first, like the others."""

from __future__ import annotations

import types
from pathlib import Path

from perf.cli import studies
from perf.studies.framework import StudyContext
from perf.studies.profiles import get_profile
from perf.studies.report import BatchingStudy
from perf.studies.study import FamilyResult, StudyResult, StudyRunner, StudyTools, count_steps

SERVER = types.SimpleNamespace(grpc_url="localhost:1", http_url="localhost:2", metrics_url=None, pid=None)


def runner(tmp_path: Path, tools: StudyTools, **context: object) -> StudyRunner:
    return StudyRunner(StudyContext(get_profile("smoke"), tmp_path, tmp_path, **context), tools=tools)


def test_a_failed_cross_check_keeps_the_study(tmp_path: Path) -> None:
    def fails(*args: object, **kwargs: object) -> None:
        raise RuntimeError("perf_analyzer exited with status 1")

    tools = StudyTools(perf_analyzer=lambda: Path("/usr/bin/perf_analyzer"), analyzer_engine=fails)
    study = runner(tmp_path, tools)
    result = StudyResult(study.profile, study.repository, started=None)
    study._cross_check(SERVER, result)
    assert result.cross_check == [] and "exited with status 1" in result.analyzer_note


def test_a_profile_without_the_cross_check_says_so_and_never_looks_for_perf_analyzer(tmp_path: Path) -> None:
    def never() -> None:
        raise AssertionError("perf_analyzer looked for")

    context = StudyContext(get_profile("smoke", perf_analyzer=False), tmp_path, tmp_path)
    study = StudyRunner(context, tools=StudyTools(perf_analyzer=never))
    result = StudyResult(study.profile, study.repository, started=None)
    study._cross_check(SERVER, result)
    assert result.cross_check == [] and result.analyzer_note == "Off in this profile."


def test_zero_capacity_skips_the_open_loop_with_a_note(tmp_path: Path) -> None:
    nothing = types.SimpleNamespace(
        summary=lambda: types.SimpleNamespace(throughput=0.0, p99_ms=0.0, failed=9), records=[]
    )
    loads = []

    def measure(target: object, load: object, *args: object, **kwargs: object) -> object:
        loads.append(load.kind)
        return nothing

    study = runner(tmp_path, StudyTools(measure_raw=lambda *args: []), measurement=measure)
    family = study._run_family(SERVER, "recommender")
    assert isinstance(family, FamilyResult) and family.capacity == 0
    assert family.open_loop == {} and family.open_load is None and "did not run" in family.open_loop_note
    assert set(loads) == {"closed"}


def test_make_perf_runs_the_batching_study_first_like_the_others() -> None:
    profile = get_profile("smoke")
    listed = studies()
    assert isinstance(listed[0], BatchingStudy) and listed[0].steps(profile) == count_steps(profile)
    assert all(s.name and s.title and isinstance(s.serves_spec, bool) for s in listed)
