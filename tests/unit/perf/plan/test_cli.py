"""``python -m perf plan``'s options and its setup, without a server: a value it cannot run with is
refused before any report folder is made, naming the option (exit status 2); what ``make plan`` runs
with unless a test says otherwise is the module's own (``PlanSetup``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from perf.cli import PerfSetup, main, parser
from perf.errors import EXIT_USAGE
from perf.plan import cli as plan_cli
from perf.plan.cli import THE_SETUP, PlanSetup, usage_errors

BUDGET = ["--model", "recommender", "--p99-ms", "10"]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--model", "m", "--p99-ms", "0"], "--p99-ms must be > 0, got 0.0"),
        (["--model", "m", "--p99-ms", "-1"], "--p99-ms must be > 0, got -1.0"),
        ([*BUDGET, "--accuracy", "-0.1"], "--accuracy must be >= 0, got -0.1"),
        ([*BUDGET, "--seconds", "0"], "--seconds must be > 0, got 0.0"),
        ([*BUDGET, "--predict-s", "0"], "--predict-s must be > 0, got 0.0"),
        ([*BUDGET, "--p99-samples", "0"], "--p99-samples must be >= 1, got 0"),
        ([*BUDGET, "--probe-runs", "-1"], "--probe-runs and --verify must be >= 0"),
        ([*BUDGET, "--verify", "-1"], "--probe-runs and --verify must be >= 0"),
    ],
)
def test_a_value_plan_cannot_run_with_is_refused_naming_it(argv: list[str], said: str) -> None:
    assert usage_errors(parser().parse_args(["plan", *argv])) == said


def test_options_plan_can_run_with_pass() -> None:
    assert (
        usage_errors(parser().parse_args(["plan", *BUDGET, "--accuracy", "0", "--probe-runs", "0"])) is None
    )


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        ("--instances", "1,x", "--instances '1,x': invalid literal for int()"),
        ("--instances", "", "--instances '': needs non-negative integers"),
        ("--delays-us", "0,-500", "--delays-us '0,-500': needs non-negative integers"),
    ],
)
def test_a_search_space_it_cannot_read_exits_2_before_any_report_folder(
    option: str, value: str, said: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    reports = tmp_path / "reports"
    argv = ["plan", *BUDGET, option, value, "--probe-runs", "0", "--reports", str(reports)]
    assert main(argv, PerfSetup(plan=PlanSetup(live_topology=lambda: None))) == EXIT_USAGE
    assert said in capsys.readouterr().out.replace("\n", "")
    assert not reports.exists()


def test_make_plan_runs_with_the_modules_own_parts() -> None:
    assert THE_SETUP.measure_profile is plan_cli.measure_profile
    assert THE_SETUP.real_server is plan_cli.real_server and THE_SETUP.live_topology is plan_cli.live_topology
    assert PerfSetup().plan is THE_SETUP
