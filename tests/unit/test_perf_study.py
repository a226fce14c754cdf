"""The study's guards without a server: bad options stop before measuring, late failures do not lose it."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from perf.cli import main
from perf.errors import OptionError
from perf.measure.engine import MeasureSettings
from perf.studies.profiles import get_profile
from perf.studies.study import FamilyResult, StudyResult, StudyRunner

SERVER = types.SimpleNamespace(grpc_url="localhost:1", http_url="localhost:2")


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"max_windows": 0}, "max_windows"),
        ({"stable_windows": 4, "max_windows": 3}, "max_windows"),
        ({"stable_windows": 0}, "stable_windows"),
        ({"window_s": 0.0}, "window_s"),
        ({"window_s": -1.0}, "window_s"),
    ],
)
def test_measure_settings_name_the_bad_field(settings: dict, message: str) -> None:
    with pytest.raises(OptionError, match=message):
        MeasureSettings(**settings)


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--max-windows", "0"], "max_windows"),
        (["--window", "0"], "window_s"),
        (["--rate-fraction", "0"], "poisson_fraction"),
        (["--modes", "none,dynX"], "unknown modes (--modes): dynX; choose from none,"),
        (["--models", "resnet"], "unknown models (--models): resnet"),
        (["--concurrency", "1,x"], "--concurrency '1,x'"),
        (["--goal-concurrency", "0"], "--goal-concurrency 0"),
        (["--trace", "no/such/file"], "trace (--trace) 'no/such/file' is not a file"),
        (["--spec", "no/such.yaml", "--profile", "quick"], "--spec no/such.yaml: no such file"),
    ],
)
def test_cli_rejects_bad_options_as_usage_errors(
    option: list[str], message: str, capsys, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def must_not_run(*args: object) -> int:
        raise AssertionError("the study started despite a bad option")

    monkeypatch.setattr("perf.cli.command_run", must_not_run)
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--profile", "smoke", "--reports", str(tmp_path / "reports"), *option])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "reports").exists()


@pytest.fixture()
def runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StudyRunner:
    study = StudyRunner(get_profile("smoke"), tmp_path, tmp_path / "server.log")
    monkeypatch.setattr(study, "target", lambda server, model: types.SimpleNamespace(inputs={}))
    return study


def test_a_failed_cross_check_keeps_the_study(runner: StudyRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    def fails(*args: object, **kwargs: object) -> None:
        raise RuntimeError("perf_analyzer exited with status 1")

    monkeypatch.setattr("perf.studies.study.find_perf_analyzer", lambda: Path("/usr/bin/perf_analyzer"))
    monkeypatch.setattr("perf.studies.study.PerfAnalyzerEngine", fails)
    result = StudyResult(runner.profile, runner.spec, runner.repository, started=None)
    runner._cross_check(SERVER, result)
    assert result.cross_check == [] and "exited with status 1" in result.analyzer_note


def test_zero_capacity_skips_the_open_loop_with_a_note(
    runner: StudyRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    nothing = types.SimpleNamespace(
        summary=lambda: types.SimpleNamespace(throughput=0.0, p99_ms=0.0, failed=9)
    )
    loads = []

    def measure(server: object, model: str, load: object, label: str) -> object:
        loads.append(load.kind)
        return nothing

    monkeypatch.setattr(runner, "_measure", measure)
    monkeypatch.setattr("perf.studies.study.measure_raw", lambda *args: [])
    family = runner._run_family(SERVER, "recommender")
    assert isinstance(family, FamilyResult) and family.capacity == 0
    assert family.open_loop == {} and family.open_load is None and "did not run" in family.open_loop_note
    assert set(loads) == {"closed"}
