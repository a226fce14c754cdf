"""The tools beside the tuner take frozen options, built from the command line in one place
(``perf.bench.cli.options_from_args``): each field arrives as given, a value a tool cannot run with is
refused naming its option (``OptionError``: exit status 2, one line), before any report folder is made.
No server starts here."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from rich.console import Console

from perf.bench import cli as bench_cli
from perf.bench.cli import BesideOptions, beside_the_tuner, options_from_args
from perf.bench.follow import FollowOptions
from perf.bench.scenarios import ScenarioOptions
from perf.bench.steal_check import StealCheckOptions
from perf.bench.witness import WitnessOptions, witness_section
from perf.cli import main, parser
from perf.errors import EXIT_USAGE, OptionError
from perf.tune.cli import Beside

SPEC = Path(__file__).resolve().parents[2] / "models.yaml"


@pytest.mark.parametrize(
    ("kind", "values", "option"),
    [
        (ScenarioOptions, {"scenario": "cinema"}, "--scenario"),
        (ScenarioOptions, {"scenario": "video", "p99_ms": 0.0}, "--p99-ms"),
        (ScenarioOptions, {"scenario": "recsys", "model": ""}, "--model"),
        (ScenarioOptions, {"scenario": "recsys", "seed": -1}, "--seed"),
        (FollowOptions, {"seconds": 0.0}, "--seconds"),
        (FollowOptions, {"seconds": 2.4, "p99_ms": -1.0}, "--p99-ms"),
        (FollowOptions, {"seconds": 2.4, "model": ""}, "--model"),
        (FollowOptions, {"seconds": 2.4, "seed": -3}, "--seed"),
        (BesideOptions, {"witness": "locust"}, "--witness"),
        (WitnessOptions, {"max_batch": 0}, "--max-batch"),
        (WitnessOptions, {"delay_us": -1}, "--delay-us"),
        (WitnessOptions, {"instances": 0}, "--instances"),
        (WitnessOptions, {"concurrency": 0}, "--concurrency"),
        (WitnessOptions, {"model": ""}, "--model"),
        (StealCheckOptions, {"runs": 0}, "--runs"),
        (StealCheckOptions, {"rate": 0.0}, "--rate"),
        (StealCheckOptions, {"p99_ms": -5.0}, "--p99-ms"),
        (StealCheckOptions, {"max_batch": 0}, "--max-batch"),
        (StealCheckOptions, {"delay_us": -1}, "--delay-us"),
        (StealCheckOptions, {"instances": 0}, "--instances"),
        (StealCheckOptions, {"model": ""}, "--model"),
    ],
)
def test_a_value_a_tool_cannot_run_with_is_refused_naming_its_option(
    kind: type, values: dict, option: str
) -> None:
    with pytest.raises(OptionError, match=f"^{re.escape(option)} "):
        kind(**values)


def every_field_differs_from_its_default(options: object) -> bool:
    """So that a field from_args dropped (left at its default) shows as a difference."""
    return all(
        getattr(options, f.name) != f.default
        for f in dataclasses.fields(options)
        if f.default is not dataclasses.MISSING
    )


def test_the_tune_command_line_carries_each_field_of_the_scenario_follow_and_beside_options() -> None:
    common = ["--spec", "other.yaml", "--model", "recommender_pipeline", "--p99-ms", "7", "--seed", "3"]
    args = parser().parse_args(["tune", "--scenario", "video", *common])
    scenario = ScenarioOptions("video", Path("other.yaml"), 7.0, "recommender_pipeline", 3)
    assert options_from_args(ScenarioOptions, args) == scenario
    assert every_field_differs_from_its_default(scenario)
    args = parser().parse_args(["tune", "--follow", "--seconds", "5", *common])
    follow = FollowOptions(5.0, Path("other.yaml"), "recommender_pipeline", 7.0, 3)
    assert options_from_args(FollowOptions, args) == follow
    assert every_field_differs_from_its_default(follow)
    args = parser().parse_args(["tune", "--witness", "model-analyzer", "--witness-smoke"])
    beside = BesideOptions("model-analyzer", witness_smoke=True)
    assert options_from_args(BesideOptions, args) == beside
    assert every_field_differs_from_its_default(beside)


def test_an_option_not_given_keeps_the_tool_s_default() -> None:
    """No ``--model`` or ``--p99-ms``: the recommender, and the scenario's own budget (the article's)."""
    for scenario, budget in (("video", 15.0), ("recsys", 10.0)):
        options = options_from_args(ScenarioOptions, parser().parse_args(["tune", "--scenario", scenario]))
        assert (options.model, options.p99_ms, options.budget_ms) == ("recommender", None, budget)
    assert ScenarioOptions("video", p99_ms=20.0).budget_ms == 20.0
    follow = options_from_args(FollowOptions, parser().parse_args(["tune", "--follow"]))
    assert (follow.model, follow.p99_ms, follow.spec) == ("recommender", 10.0, Path("models.yaml"))
    assert options_from_args(BesideOptions, parser().parse_args(["tune"])) == BesideOptions()


def test_witness_and_steal_check_carry_each_field_and_default_to_their_options() -> None:
    assert options_from_args(WitnessOptions, bench_cli.witness_parser().parse_args([])) == WitnessOptions()
    assert options_from_args(StealCheckOptions, bench_cli.steal_check_parser().parse_args([])) == (
        StealCheckOptions()
    )
    argv = ["--model", "text_encoder", "--spec", "s.yaml", "--max-batch", "4", "--delay-us", "500",
            "--instances", "1", "--concurrency", "4", "--workdir", "w"]  # fmt: skip
    witness = WitnessOptions("text_encoder", Path("s.yaml"), 4, 500, 1, 4, Path("w"))
    assert options_from_args(WitnessOptions, bench_cli.witness_parser().parse_args(argv)) == witness
    assert every_field_differs_from_its_default(witness)
    argv = ["--model", "text_encoder", "--spec", "s.yaml", "--rate", "900", "--runs", "3", "--max-batch", "8",
            "--delay-us", "0", "--instances", "2", "--p99-ms", "20"]  # fmt: skip
    steal = StealCheckOptions("text_encoder", Path("s.yaml"), 900.0, 3, 8, 0, 2, 20.0)
    assert options_from_args(StealCheckOptions, bench_cli.steal_check_parser().parse_args(argv)) == steal
    assert every_field_differs_from_its_default(steal)


def test_witness_picks_the_hooks_beside_the_tuner() -> None:
    assert beside_the_tuner(BesideOptions()) == Beside()
    assert beside_the_tuner(BesideOptions("perf_analyzer")).on_server is witness_section
    after = beside_the_tuner(BesideOptions("model-analyzer", witness_smoke=True)).after
    assert after is not None and after.keywords == {"smoke": True}


@pytest.mark.parametrize("tool", [["--scenario", "recsys"], ["--follow", "--engine", "ours"]])
def test_a_bad_value_for_a_tool_exits_2_in_one_line_before_any_report_folder(
    tool: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr("perf.cli.console", Console(width=400))
    reports = tmp_path / "reports"
    assert main(["tune", *tool, "--spec", str(SPEC), "--seed", "-1", "--reports", str(reports)]) == EXIT_USAGE
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert line == "tune failed: --seed must be >= 0, got -1"
    assert not reports.exists()


def test_the_tools_run_alone_refuse_a_bad_value_as_a_usage_error(capsys: pytest.CaptureFixture) -> None:
    for argv, option in (
        (["steal-check", "--runs", "0"], "--runs"),
        (["witness", "--instances", "0"], "--instances"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == EXIT_USAGE
        assert f"error: {option} must be >= 1, got 0" in capsys.readouterr().err


def test_the_scenario_and_the_follow_run_get_their_options_from_the_tune_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``python -m perf tune --scenario|--follow`` hands the tool its options and a report folder (the
    tool itself replaced by a probe of what it was given)."""
    given: list[object] = []
    monkeypatch.setattr(bench_cli, "run_scenario", lambda options, folder, *rest: given.append(options) or 0)
    monkeypatch.setattr(bench_cli, "run_follow", lambda options, folder, console: given.append(options) or 0)
    reports = ["--spec", str(SPEC), "--engine", "ours", "--reports", str(tmp_path)]
    assert main(["tune", "--scenario", "recsys", "--model", "recommender_pipeline", *reports]) == 0
    assert main(["tune", "--follow", "--seconds", "6", "--p99-ms", "12", *reports]) == 0
    assert given == [
        ScenarioOptions("recsys", SPEC, model="recommender_pipeline"),
        FollowOptions(6.0, SPEC, p99_ms=12.0),
    ]
