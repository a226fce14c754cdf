"""Every ``python -m perf`` command ends with one of four statuses, decided in one place
(``perf.cli.main``): 2 for a usage or spec error (one line, before any report folder is made), 1 for
a run that failed, 130 for Ctrl-C, 3 for "nothing meets the budget" (test_tune_demotion and
test_plan_verdict hold that one). The tuning itself is replaced here; no server starts."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from rich.console import Console

from perf.cli import PerfSetup, main
from perf.errors import EXIT_INTERRUPTED, EXIT_RUNTIME, EXIT_USAGE, StudyError
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
    import types

    from perf.cli import _redeliver_lost_interrupts

    passed_on: list[object] = []
    hook = _redeliver_lost_interrupts(passed_on.append)
    delivered = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: delivered.set())
    try:
        hook(types.SimpleNamespace(exc_value=KeyboardInterrupt()))
        for _ in range(100):  # the handler runs in the main thread, between bytecodes
            if delivered.wait(0.02):
                break
        assert delivered.is_set(), "the dropped interrupt was not delivered again"
        other = types.SimpleNamespace(exc_value=ValueError("x"))
        hook(other)
        assert passed_on == [other]
    finally:
        signal.signal(signal.SIGTERM, previous)
