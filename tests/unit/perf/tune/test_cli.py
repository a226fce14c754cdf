"""``python -m perf tune``'s options and its setup, without a server: a value it cannot run with is
refused before anything is measured, naming the option; a trace is scaled to each rate; and the load
engine is perf_analyzer where asked or, with ``auto``, where it is installed
(``TuneSetup.perf_analyzer``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from perf.cli import parser
from perf.measure.loads import arrival_times
from perf.tune.cli import TuneSetup, _load_at, engine_name, usage_errors

HERE = TuneSetup(perf_analyzer=lambda: Path("/opt/perf_analyzer"))
ABSENT = TuneSetup(perf_analyzer=lambda: None)
BUDGET = ["--model", "m", "--p99-ms", "5"]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--model", "recommender"], "--model and --p99-ms are required"),
        (["--p99-ms", "5"], "--model and --p99-ms are required"),
        (["--model", "m", "--p99-ms", "0"], "--p99-ms must be > 0, got 0.0"),
        (["--model", "m", "--p99-ms", "-2"], "--p99-ms must be > 0, got -2.0"),
        ([*BUDGET, "--rate", "-1"], "--rate must be > 0, got -1.0"),
        ([*BUDGET, "--rate", "0"], "--rate must be > 0, got 0.0"),
        ([*BUDGET, "--seconds", "0"], "--seconds must be > 0, got 0.0"),
        ([*BUDGET, "--shortlist", "-1"], "--shortlist must be >= 0, got -1"),
        ([*BUDGET, "--trace", "no/such/trace.txt"], "--trace: no such file 'no/such/trace.txt'"),
        ([*BUDGET, "--engine", "perf_analyzer"], "--engine perf_analyzer: perf_analyzer is unavailable"),
    ],
)
def test_a_value_tune_cannot_run_with_is_refused_naming_it(argv: list[str], said: str) -> None:
    error = usage_errors(parser().parse_args(["tune", *argv]), ABSENT)
    assert error is not None and error.startswith(said)


@pytest.mark.parametrize("engine", ["auto", "ours", "perf_analyzer"])
def test_options_tune_can_run_with_pass(engine: str) -> None:
    assert usage_errors(parser().parse_args(["tune", *BUDGET, "--engine", engine]), HERE) is None


def test_a_trace_is_scaled_to_each_rate(tmp_path: Path) -> None:
    trace = tmp_path / "trace.txt"
    trace.write_text("0.01\n0.03\n")  # 50/s as recorded
    load_at = _load_at(parser().parse_args(["tune", "--trace", str(trace)]))
    assert arrival_times(load_at(100.0), 1.0)[:2].tolist() == pytest.approx([0.005, 0.02])  # time ×0.5
    assert _load_at(parser().parse_args(["tune"])) is None  # Poisson, the request's own


def test_engine_perf_analyzer_needs_perf_analyzer() -> None:
    args = parser().parse_args(
        ["tune", "--model", "recommender", "--p99-ms", "10", "--engine", "perf_analyzer"]
    )
    error = usage_errors(args, ABSENT)
    assert error is not None and "make perf-analyzer" in error
    assert usage_errors(args, HERE) is None
    default = parser().parse_args(["tune", "--model", "recommender", "--p99-ms", "10"])
    assert default.engine == "auto" and usage_errors(default, ABSENT) is None


def test_engine_auto_takes_perf_analyzer_where_installed() -> None:
    auto = parser().parse_args(["tune", "--model", "recommender", "--p99-ms", "10"])
    assert engine_name(auto, HERE) == "perf_analyzer" and engine_name(auto, ABSENT) == "ours"
    explicit = parser().parse_args(["tune", "--model", "recommender", "--p99-ms", "10", "--engine", "ours"])
    assert engine_name(explicit, HERE) == "ours"
