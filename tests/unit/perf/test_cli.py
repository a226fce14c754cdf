"""``python -m perf`` (``perf.cli``) without a server: every command ends with one of four statuses,
decided in one place (``main``): 2 for a usage or spec error (one line, before any report folder is
made), 1 for a run that failed, 130 for Ctrl-C, 3 for "nothing meets the budget" (tune/test_tuner_evidence
and plan/test_verify hold that one); bad options stop ``make perf`` before measuring, and it runs every
study through one loop. The tuning and the studies are replaced through ``PerfSetup``."""

from __future__ import annotations

import dataclasses
import types
from pathlib import Path

import pytest
from rich.console import Console

from perf.cli import PerfSetup, main, run_studies
from perf.errors import EXIT_INTERRUPTED, EXIT_RUNTIME, EXIT_USAGE, StudyError
from perf.studies.framework import StudyContext, StudyReport, SummaryTable
from perf.studies.goals import Goal
from perf.studies.profiles import get_profile
from perf.tune.cli import TuneSetup
from tests.unit.perf.simulated_server import SimulatedServer

SPEC = Path(__file__).resolve().parents[3] / "models.yaml"


WIDE = PerfSetup(Console(width=400))  # a console wide enough that no line wraps


@pytest.fixture
def printed(capsys: pytest.CaptureFixture):
    """What the CLI printed, as lines."""
    return lambda: [line.strip() for line in capsys.readouterr().out.splitlines() if line.strip()]


def failing(error: BaseException) -> PerfSetup:
    """``make tune`` whose tuning raises ``error`` (no server starts)."""

    def tuner(*args: object, **kwargs: object) -> None:
        raise error

    return dataclasses.replace(WIDE, tune=TuneSetup(session=SimulatedServer({}).as_session(), tuner=tuner))


def tune_args(reports: Path, spec: Path = SPEC) -> list[str]:
    return ["tune", "--spec", str(spec), "--model", "recommender", "--p99-ms", "10", "--engine", "ours",
            "--reports", str(reports)]  # fmt: skip


@pytest.mark.parametrize("command", ["tune", "plan"])
def test_a_spec_that_does_not_exist_exits_2_in_one_line_and_makes_no_report_folder(
    command: str, tmp_path: Path, printed
) -> None:
    missing, reports = tmp_path / "missing.yaml", tmp_path / "reports"
    args = [command, "--spec", str(missing), "--model", "m", "--p99-ms", "10", "--reports", str(reports)]
    assert main(args, WIDE) == EXIT_USAGE == 2
    (line,) = printed()
    assert line.startswith(f"{command} failed: ") and str(missing) in line
    assert not reports.exists()


def test_a_model_the_spec_lacks_exits_2_and_makes_no_report_folder(tmp_path: Path, printed) -> None:
    reports = tmp_path / "reports"
    args = [
        "plan",
        "--spec",
        str(SPEC),
        "--model",
        "no_such_model",
        "--p99-ms",
        "10",
        "--reports",
        str(reports),
    ]
    assert main(args, WIDE) == EXIT_USAGE
    (line,) = printed()
    assert "no_such_model" in line
    assert not reports.exists()


def test_a_run_that_fails_exits_1_naming_the_error_and_what_was_measured(tmp_path: Path, printed) -> None:
    lost = failing(StudyError("the engine lost the server"))
    assert main(tune_args(tmp_path / "reports"), lost) == EXIT_RUNTIME == 1
    lines = printed()
    assert lines[-2] == "tune failed: the engine lost the server"
    (folder,) = (tmp_path / "reports").iterdir()
    assert lines[-1] == f"what was measured before it: {folder / 'partial.md'}"


def test_ctrl_c_exits_130_saying_the_server_was_stopped(tmp_path: Path, printed) -> None:
    assert main(tune_args(tmp_path / "reports"), failing(KeyboardInterrupt())) == EXIT_INTERRUPTED == 130
    assert printed()[-1] == "interrupted; the server was stopped"


def test_an_option_out_of_range_is_argparse_s_usage_error_with_status_2(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["tune", "--spec", str(SPEC), "--model", "recommender", "--p99-ms", "-1"])
    assert exit_info.value.code == EXIT_USAGE


def test_a_tool_beside_the_tuner_is_its_own_subcommand_with_its_own_options(
    capsys: pytest.CaptureFixture,
) -> None:
    for tool in ("witness",):
        with pytest.raises(SystemExit) as exit_info:
            main([tool, "--help"])
        assert exit_info.value.code == 0
        assert f"usage: python -m perf {tool} " in capsys.readouterr().out


def test_an_interrupt_dropped_in_a_callback_is_delivered_again() -> None:
    """A SIGTERM whose KeyboardInterrupt landed in a weakref or GC callback is printed and dropped by
    Python; the hook sends SIGTERM once more so the run still stops (exit 130), and other unraisable
    exceptions reach the previous hook unchanged."""
    import signal
    import threading

    from perf.cli import _redeliver_lost_interrupts

    passed_on: list[object] = []
    hook = _redeliver_lost_interrupts(passed_on.append)
    delivered = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: delivered.set())
    try:
        hook(types.SimpleNamespace(exc_value=KeyboardInterrupt()))
        for _ in range(3000):  # the handler runs in the main thread, between bytecodes; a minute's hang guard
            if delivered.wait(0.02):
                break
        assert delivered.is_set(), "the dropped interrupt was not delivered again"
        other = types.SimpleNamespace(exc_value=ValueError("x"))
        hook(other)
        assert passed_on == [other]
    finally:
        signal.signal(signal.SIGTERM, previous)


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
    """In order; a study the profile does not ask for is skipped; a study with summary tables
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
    from perf.studies.analysis import all_goals
    from perf.studies.goals import goals_table
    from tests.unit.perf.test_markdown import result as one_model_run

    result = one_model_run.__wrapped__(tmp_path)
    result.families["tagger"] = result.families["recommender"]
    goals = all_goals(result)
    names = [g.name for g in goals if g.model == "recommender"]
    assert names and [g.name for g in goals if g.model == "tagger"] == names  # each model, the same goals
    assert goals_table(goals).splitlines()[0].startswith("| model | goal |")
    print_goals(goals, PerfSetup().console)
    console = capsys.readouterr().out
    assert "┃ model " in console and "tagger" in console and "recommender" in console
