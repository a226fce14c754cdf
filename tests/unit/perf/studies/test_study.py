"""The studies' guards without a server: bad options stop before measuring, late failures do not lose
the batching study, and ``make perf`` runs every study, the batching study first, through one loop."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from perf.cli import PerfSetup, main, run_studies
from perf.errors import OptionError
from perf.measure.engine import MeasureSettings
from perf.studies.batching import BatchingStudy
from perf.studies.catalog import studies
from perf.studies.framework import StudyContext, StudyReport, SummaryTable
from perf.studies.goals import Goal
from perf.studies.profiles import get_profile
from perf.studies.study import FamilyResult, StudyResult, StudyRunner, StudyTools, count_steps

SERVER = types.SimpleNamespace(grpc_url="localhost:1", http_url="localhost:2", metrics_url=None, pid=None)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"max_windows": 0}, "max_windows"),
        ({"stable_windows": 4, "max_windows": 3}, "max_windows"),
        ({"stable_windows": 0}, "stable_windows"),
        ({"window_s": 0.0}, "window_s"),
        ({"window_s": -1.0}, "window_s"),
        ({"window_batches": 0}, "window_batches"),
    ],
)
def test_measure_settings_name_the_bad_field(settings: dict, message: str) -> None:
    with pytest.raises(OptionError, match=message):
        MeasureSettings(**settings)


class MustNotRun:
    """A study that serves the spec and fails the test if it starts."""

    name, title, serves_spec = "must-not-run", "must-not-run study", True

    def steps(self, profile: object) -> int:
        return 1

    def run(self, context: StudyContext) -> StudyReport:
        raise AssertionError("the study started despite a bad option")


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
    option: list[str], message: str, capsys, tmp_path: Path
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(
            ["run", "--profile", "smoke", "--reports", str(tmp_path / "reports"), *option],
            PerfSetup(studies=lambda: [MustNotRun()]),
        )
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "reports").exists()


def runner(tmp_path: Path, tools: StudyTools) -> StudyRunner:
    return StudyRunner(get_profile("smoke"), tmp_path, tmp_path / "server.log", tools=tools)


def test_a_failed_cross_check_keeps_the_study(tmp_path: Path) -> None:
    def fails(*args: object, **kwargs: object) -> None:
        raise RuntimeError("perf_analyzer exited with status 1")

    tools = StudyTools(perf_analyzer=lambda: Path("/usr/bin/perf_analyzer"), analyzer_engine=fails)
    study = runner(tmp_path, tools)
    result = StudyResult(study.profile, study.spec, study.repository, started=None)
    study._cross_check(SERVER, result)
    assert result.cross_check == [] and "exited with status 1" in result.analyzer_note


def test_zero_capacity_skips_the_open_loop_with_a_note(tmp_path: Path) -> None:
    nothing = types.SimpleNamespace(
        summary=lambda: types.SimpleNamespace(throughput=0.0, p99_ms=0.0, failed=9)
    )
    loads = []

    def measure(target: object, load: object, *args: object, **kwargs: object) -> object:
        loads.append(load.kind)
        return nothing

    study = runner(tmp_path, StudyTools(measure=measure, measure_raw=lambda *args: []))
    family = study._run_family(SERVER, "recommender")
    assert isinstance(family, FamilyResult) and family.capacity == 0
    assert family.open_loop == {} and family.open_load is None and "did not run" in family.open_loop_note
    assert set(loads) == {"closed"}


def test_make_perf_runs_the_batching_study_first_like_the_others() -> None:
    profile = get_profile("smoke")
    listed = studies()
    assert isinstance(listed[0], BatchingStudy) and listed[0].steps(profile) == count_steps(profile)
    assert all(s.name and s.title and isinstance(s.serves_spec, bool) for s in listed)


class FakeStudy:
    serves_spec = False

    def __init__(self, name: str, steps: int, summary: tuple[SummaryTable, ...] = ()) -> None:
        self.name, self.title, self.total, self.summary = name, f"{name} study", steps, summary

    def steps(self, profile: object) -> int:
        return self.total

    def run(self, context: StudyContext) -> StudyReport:
        for index in range(self.total):
            context.progress(f"{self.name} step {index}")
        path = context.folder / f"{self.name}.md"
        path.write_text(f"# the {self.name} report\n")
        return StudyReport(self.name, self.title, path, [Goal("g", "t", "m", True)], self.summary)


def test_every_study_runs_through_one_loop(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """In catalog order; a study the profile does not ask for is skipped; a study with summary tables
    shows them and its goals, another its whole report."""
    table = SummaryTable("first: every mode", ("mode", "QPS"), (("none", "12"),))
    ran = [FakeStudy("first", 2, (table,)), FakeStudy("skipped", 0), FakeStudy("last", 1)]
    run_studies(ran, get_profile("smoke"), tmp_path, tmp_path / "models.yaml", PerfSetup().console)
    out = capsys.readouterr().out
    assert (
        out.index("first study") < out.index("skipped study: not in profile smoke") < out.index("last study")
    )
    assert "│ none │  12 │" in out and "# the first report" not in out and "first.md" in out
    assert "# the last report" in out
    assert not (tmp_path / "skipped.md").exists()


def test_a_missing_spec_stops_only_a_profile_whose_studies_serve_it(tmp_path: Path) -> None:
    """The spec is a usage error only where a study the profile runs serves it."""
    missing, reports = tmp_path / "no-such.yaml", tmp_path / "reports"
    argv = ["run", "--profile", "smoke", "--spec", str(missing), "--reports", str(reports)]
    assert main(argv, PerfSetup(studies=lambda: [FakeStudy("alone", 1)])) == 0
    (folder,) = reports.iterdir()
    assert (folder / "alone.md").is_file()
    with pytest.raises(SystemExit) as exit_info:
        main(argv, PerfSetup(studies=lambda: [MustNotRun()]))
    assert exit_info.value.code == 2


def test_every_model_of_a_two_model_run_has_its_goals_named_by_model(tmp_path: Path, capsys) -> None:
    from perf.cli import print_goals
    from perf.studies.batching_goals import all_goals
    from perf.studies.goals import goals_table
    from tests.unit.perf.test_unmeasured import result as one_model_run

    result = one_model_run.__wrapped__(tmp_path)
    result.families["tagger"] = result.families["recommender"]
    goals = all_goals(result)
    names = [g.name for g in goals if g.model == "recommender"]
    assert names and [g.name for g in goals if g.model == "tagger"] == names  # each model, the same goals
    assert goals_table(goals).splitlines()[0].startswith("| model | goal |")
    print_goals(goals, PerfSetup().console)
    console = capsys.readouterr().out
    assert "┃ model " in console and "tagger" in console and "recommender" in console
