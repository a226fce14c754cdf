"""``python -m perf tune``'s options and its setup, without a server: a value it cannot run with is refused
before anything is measured, and the load engine is perf_analyzer where asked or, with ``auto``, where
it is installed (``TuneSetup.perf_analyzer``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from perf.measure.loads import arrival_times


def test_engine_perf_analyzer_needs_perf_analyzer() -> None:
    from perf.cli import parser
    from perf.tune.cli import TuneSetup, usage_errors

    absent = TuneSetup(perf_analyzer=lambda: None)
    args = parser().parse_args(
        ["tune", "--model", "recommender", "--p99-ms", "10", "--engine", "perf_analyzer"]
    )
    error = usage_errors(args, absent)
    assert error is not None and "make perf-analyzer" in error
    assert usage_errors(args, TuneSetup(perf_analyzer=lambda: Path("/opt/perf_analyzer"))) is None
    default = parser().parse_args(["tune", "--model", "recommender", "--p99-ms", "10"])
    assert default.engine == "auto" and usage_errors(default, absent) is None


def test_engine_auto_takes_perf_analyzer_where_installed() -> None:
    from perf.cli import parser
    from perf.tune.cli import TuneSetup, engine_name

    here, absent = (
        TuneSetup(perf_analyzer=lambda: Path("/opt/perf_analyzer")),
        TuneSetup(perf_analyzer=lambda: None),
    )
    auto = parser().parse_args(["tune", "--model", "recommender", "--p99-ms", "10"])
    assert engine_name(auto, here) == "perf_analyzer" and engine_name(auto, absent) == "ours"
    explicit = parser().parse_args(["tune", "--model", "recommender", "--p99-ms", "10", "--engine", "ours"])
    assert engine_name(explicit, here) == "ours"


def test_tune_options_are_checked_before_any_measurement(tmp_path: Path) -> None:
    from perf.cli import parser
    from perf.tune.cli import _load_at, usage_errors

    def errors(*argv: str) -> str | None:
        return usage_errors(parser().parse_args(["tune", *argv]))

    assert "--model and --p99-ms" in errors("--model", "recommender")
    assert "--p99-ms must be > 0" in errors("--model", "m", "--p99-ms", "0")
    assert "--rate must be > 0" in errors("--model", "m", "--p99-ms", "5", "--rate", "-1")
    assert "no such file" in errors("--model", "m", "--p99-ms", "5", "--trace", str(tmp_path / "none"))
    assert "--seconds must be > 0" in errors("--model", "m", "--p99-ms", "5", "--seconds", "0")
    assert "--shortlist must be >= 0" in errors("--model", "m", "--p99-ms", "5", "--shortlist", "-1")
    assert errors("--model", "m", "--p99-ms", "5", "--engine", "ours") is None
    trace = tmp_path / "trace.txt"
    trace.write_text("0.01\n0.03\n")  # 50/s as recorded
    load_at = _load_at(parser().parse_args(["tune", "--trace", str(trace)]))
    assert arrival_times(load_at(100.0), 1.0)[:2].tolist() == pytest.approx([0.005, 0.02])  # time ×0.5
