"""A p99 judged on too few requests (``perf.measure.engine.P99_SAMPLES``): such a run never meets a
budget, so the search's point misses on it, and the verdict and both tools' reports say why, with the
count. A run with enough requests is judged as before."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from perf.cli import main as perf_main
from perf.errors import EXIT_USAGE
from perf.measure.engine import P99_SAMPLES
from perf.measure.loads import poisson
from perf.measure.measurement import Measurement
from perf.measure.noise import NoisePolicy
from perf.measure.records import Record
from perf.plan.document import VerificationRow
from perf.session.model import TUNE_WINDOWS, add_window_options, run_windows, window_usage_error
from perf.session.search import Evidence, Verdict
from perf.tune.report import p99
from perf.tune.result import run_figures

BUDGET_MS = 10.0
RATE = 2.0


def measured(requests: int, latency_ms: float = 5.0) -> Measurement:
    """``requests`` answered in ``latency_ms`` each, arriving at ``RATE``/s as the load drew them."""
    load = poisson(RATE, seed=3)
    arrivals = [next(times) for times in [load.arrivals()] for _ in range(requests)]
    records = [Record("m", a, a + latency_ms / 1e3, 1, 0, 0, True, "ok", (a,)) for a in arrivals]
    span = (0.0, arrivals[-1] + 0.5)
    return Measurement(f"m @ {RATE:g}/s", "m", load, records, [span], (0, 1), True, requests)


def test_a_p99_within_the_budget_on_too_few_requests_does_not_meet_it() -> None:
    few, enough = measured(P99_SAMPLES - 1), measured(P99_SAMPLES)
    assert few.sustained and few.p99_ms <= BUDGET_MS and few.samples == P99_SAMPLES - 1
    assert few.too_few and not few.meets(BUDGET_MS)
    assert not enough.too_few and enough.meets(BUDGET_MS)  # enough: judged on its p99, as ever
    assert not measured(P99_SAMPLES, latency_ms=12.0).meets(BUDGET_MS)


def test_the_search_never_holds_a_point_on_too_few_requests_and_its_verdict_says_so() -> None:
    evidence: Evidence[str] = Evidence(BUDGET_MS)
    evidence.add("x", RATE, measured(40))
    assert evidence.verdict("x", RATE) is Verdict.OPEN  # a miss alone: measured again
    evidence.add("x", RATE, measured(40))
    assert evidence.verdict("x", RATE) is Verdict.MISSES and evidence.best() is None
    verdict = str(evidence.nothing_meets(str))
    assert verdict.startswith("nothing meets p99 <= 10 ms here: the closest measured was x at 2.0/s")
    assert verdict.endswith("(too few requests: 40; --p99-samples lowers the count a p99 rests on)")


def test_tunes_and_plans_reports_name_a_run_on_too_few_requests_with_its_count() -> None:
    few, enough = run_figures(measured(40), NoisePolicy()), run_figures(measured(P99_SAMPLES), NoisePolicy())
    assert p99(few, " ms") == "5.0 ms (too few requests: 40)" and p99(enough, " ms") == "5.0 ms"
    row = VerificationRow("x", RATE, 4.0, 5.0, RATE, False, samples=40, too_few=True)
    assert row.measured_p99_text == "5.0 (too few requests: 40)"


@pytest.mark.parametrize("command", ["tune", "plan"])
def test_tune_and_plan_take_the_count_a_p99_rests_on_from_the_command_line(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """``--p99-samples`` for a model too slow to serve 100 requests within the windows' cap; without
    it the setup's windows keep their own count (the tests' short windows keep theirs)."""
    parser = argparse.ArgumentParser()
    add_window_options(parser)
    given, default = parser.parse_args(["--p99-samples", "30"]), parser.parse_args([])
    short = dataclasses.replace(TUNE_WINDOWS, p99_samples=10)
    assert run_windows(TUNE_WINDOWS, given).p99_samples == 30
    assert run_windows(TUNE_WINDOWS, default).p99_samples == P99_SAMPLES
    assert run_windows(short, default).p99_samples == 10
    assert (
        window_usage_error(parser.parse_args(["--p99-samples", "0"])) == "--p99-samples must be >= 1, got 0"
    )
    reports = tmp_path / "reports"
    args = [
        command,
        "--model",
        "recommender",
        "--p99-ms",
        "10",
        "--p99-samples",
        "0",
        "--reports",
        str(reports),
    ]
    with pytest.raises(SystemExit) as exit_info:  # a usage error, before anything is built or measured
        perf_main(args)
    assert exit_info.value.code == EXIT_USAGE and "--p99-samples must be >= 1" in capsys.readouterr().err
    assert not reports.exists()
