"""No report prints a figure that cannot be right: a fit whose T comes out below zero, a ratio built on
it, or the latencies of a mode whose requests all failed read "could not be measured: <why>", in the
markdown report, its goals, its plot legends and the console's summary table alike.

The run is made of records and server statistics, not measured: raw onnxruntime and the server's
compute per batch size both grow faster than linearly from a tiny batch of one, so a least-squares
``T + (N-1)·Δt`` crosses zero above batch 1 (as the Paddle classifier's did); static batching's every
request failed (as AntiBERTy's empty ``static 32`` row)."""

from __future__ import annotations

import copy
import math
import re
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest

from client.stats import BatchBucket, ModelStats
from perf.markdown import NEGATIVE, UNMEASURED, Unmeasured, error_percent, fit_text, number, percent, ratio
from perf.measure.loads import closed_loop, poisson
from perf.measure.measurement import Measurement
from perf.measure.raw import RawPoint
from perf.measure.records import Record
from perf.measure.server_view import ServerDelta
from perf.model.latency import fit_latency
from perf.studies import analysis
from perf.studies.analysis import all_goals
from perf.studies.goals import all_met
from perf.studies.profiles import get_profile
from perf.studies.report import summary_tables, write_report
from perf.studies.study import FamilyResult, StudyResult

CONCURRENCY = 16
# A negative figure printed as one: a minus that starts a number (not a date's or a range's hyphen).
NEGATIVE_FIGURE = re.compile(r"(?<![\w.-])-\d+(\.\d+)?(?!%)")


def test_a_figure_that_cannot_be_right_is_reported_with_its_reason() -> None:
    assert number(-0.182, 3) == f"{UNMEASURED}: {NEGATIVE}" and ratio(-0.04).startswith(UNMEASURED)
    assert number(float("nan")).startswith(UNMEASURED) and ratio(math.inf).startswith(UNMEASURED)
    assert number(Unmeasured("no request answered")) == f"{UNMEASURED}: no request answered"
    assert number(-3.0, signed=True) == "-3.0" and percent(-12.4) == "-12%" and percent(math.nan) != "+nan%"
    assert number(0.0) == "0.0" and number(1234.5) == "1,234" and ratio(1.5) == "1.50×"
    kept = copy.deepcopy(Unmeasured("why"))  # dataclasses.asdict deep-copies: the reason survives
    assert isinstance(kept, Unmeasured) and kept.why == "why" and math.isnan(kept)


def test_an_error_against_no_figure_is_no_figure() -> None:
    """The study's, the gain checks' and the tuner's errors are one figure: signed against the measured
    one, and none where either side is none (nothing measured, a prediction below zero or infinite)."""
    assert error_percent(12.0, 10.0) == pytest.approx(20.0)
    assert error_percent(8.0, 10.0) == pytest.approx(-20.0)
    for predicted, measured in [(1.0, None), (1.0, 0.0), (-2.0, 10.0), (math.inf, 10.0), (Unmeasured(), 10.0),
                                (1.0, math.nan)]:  # fmt: skip
        assert math.isnan(error_percent(predicted, measured)), (predicted, measured)
    assert math.isnan(analysis.GainCheck("dyn1ms", measured=1.2, predicted=-0.5).error_pct)


def test_a_fit_below_zero_names_its_flaw() -> None:
    fit = fit_latency({2: 0.5, 16: 10.0, 32: 21.0})
    assert fit.t_ms < 0 and fit.flaw and "T (a batch of one) came out negative" in fit.flaw
    assert fit_text(fit).startswith(
        f"T = {UNMEASURED}: {NEGATIVE}, Δt = 0.6"
    ) and " ms, R² = 1.000" in fit_text(fit)
    assert fit_latency({1: 1.0, 8: 1.7}).flaw is None


def _records(model: str, ok: bool, count: int, batch: int, latency_s: float) -> list[Record]:
    return [
        Record(
            model, i * 0.01, i * 0.01 + latency_s, batch, 64 * batch, 4 * batch, ok, "ok" if ok else "fail"
        )
        for i in range(count)
    ]


def _measurement(model: str, records: list[Record], stats: ModelStats | None) -> Measurement:
    server = ServerDelta(1.0, stats, 0.4, 0.3) if stats is not None else None
    return Measurement(f"{model} @ c{CONCURRENCY}", model, closed_loop(CONCURRENCY), records, [(0.0, 10.0)],
                       (0, 1), True, len(records), server)  # fmt: skip


def _stats(batches: dict[int, tuple[int, float]]) -> ModelStats:
    buckets = {size: BatchBucket(runs, int(ms * runs * 1e6)) for size, (runs, ms) in batches.items()}
    inferences = sum(size * b.executions for size, b in buckets.items())
    compute = sum(size * b.compute_ns for size, b in buckets.items())
    executions = sum(b.executions for b in buckets.values())
    return ModelStats(inferences, 0, inferences, executions, 1000 * inferences, compute, buckets, compute)


@pytest.fixture()
def result(tmp_path: Path) -> StudyResult:
    profile = get_profile(
        "smoke", perf_analyzer=False, concurrencies=(CONCURRENCY,), goal_concurrency=CONCURRENCY
    )
    family = FamilyResult("recommender")
    family.sweep = {
        "none": [_measurement("recommender_none", _records("recommender_none", True, 900, 1, 0.004),
                              _stats({1: (3, 0.2)}))],  # too few to fit
        # every request of static batching failed: nothing answered, no batch formed
        "static32": [_measurement("recommender_static32",
                                  _records("recommender_static32", False, 30, 32, 0.05), _stats({}))],
        "dyn1ms": [_measurement("recommender_dyn1ms", _records("recommender_dyn1ms", True, 400, 1, 0.006),
                                _stats({2: (50, 0.5), 16: (10, 10.0), 32: (5, 21.0)}))],
    }  # fmt: skip
    family.raw = [
        RawPoint(1, 0.1, 10_000.0, 0.1),
        RawPoint(8, 4.0, 2_000.0, 0.5),
        RawPoint(32, 20.0, 1_600.0, 0.6),
    ]
    started = datetime(2000, 1, 1)
    return StudyResult(profile, tmp_path / "repository", started, started, families={"recommender": family})


def test_the_batching_report_prints_no_negative_or_nan_figure(result: StudyResult, tmp_path: Path) -> None:
    family = result.families["recommender"]
    assert analysis.fit_served(family).t_ms < 0 and analysis.fit_raw(family.raw).t_ms < 0  # the premise
    report = write_report(result, tmp_path / "report").read_text()
    assert not re.search(r"\bnan\b", report, re.IGNORECASE), report
    assert not NEGATIVE_FIGURE.search(report), NEGATIVE_FIGURE.search(report)
    assert f"**T = {UNMEASURED}: {NEGATIVE}, Δt = 0.6" in report
    assert f"Raw onnxruntime: T = {UNMEASURED}: {NEGATIVE}" in report
    assert "No prediction from this fit: the fit's T (a batch of one) came out negative" in report
    static = next(line for line in report.splitlines() if line.startswith("| static 32"))
    assert "could not be measured: no request answered (30 of 30 failed)" in static
    goals = all_goals(result)
    assert not any(re.search(r"\bnan\b|-\d", f"{g.measured} {g.limits}") for g in goals), goals
    fit_goal = next(g for g in goals if g.name == "latency-model fit")
    assert fit_goal.met is False and "came out negative" in fit_goal.limits
    efficiency = {e.mode: e for e in analysis.efficiencies(family, CONCURRENCY)}["dyn1ms"]
    assert (
        isinstance(efficiency.compute_ratio, Unmeasured) and "raw onnxruntime" in efficiency.compute_ratio.why
    )


def test_the_console_summary_prints_no_nan(result: StudyResult) -> None:
    family = result.families["recommender"]
    family.open_loop = {mode: runs[0] for mode, runs in family.sweep.items()}
    (summary,) = summary_tables(result)
    cells = [cell for row in summary.rows for cell in row]
    assert not any(re.search(r"\bnan\b", cell) or NEGATIVE_FIGURE.search(cell) for cell in cells), cells
    static = next(row for row in summary.rows if row[0].startswith("static"))
    assert static[2].startswith("could not be measured: no request answered")


def test_a_goal_over_several_parts_misses_on_a_measured_miss_and_is_not_measured_where_one_was_not() -> None:
    assert all_met([True, None, False]) is False and all_met([True, None]) is None
    assert all_met([True, True]) is True and all_met([]) is True


def _open_run(model: str, answered: bool, latency_s: float) -> Measurement:
    """An open-loop run of ``model`` whose server formed a hundred batches of 4, 1 ms each."""
    records = _records(model, answered, 400 if answered else 30, 1, latency_s)
    return replace(_measurement(model, records, _stats({4: (100, 1.0)})), load=poisson(200.0))


def test_an_open_loop_mode_that_batched_but_answered_nothing_is_not_measured(
    result: StudyResult, tmp_path: Path
) -> None:
    """Triton counts a Python-backend error as a success, so a dynamic mode can form batches on the
    server while the client counts no answer: its p99 is no figure, and the Poisson goal says so
    (the bound at a 1 ms delay is 1 + 1 + 2 ms)."""
    family = result.families["recommender"]
    family.open_load = poisson(200.0)
    family.open_loop = {
        "dyn1ms": _open_run("recommender_dyn1ms", True, 0.003),
        "dyn10ms": _open_run("recommender_dyn10ms", False, 0.05),
    }
    (goal,) = [g for g in all_goals(result) if g.name.startswith("Poisson p99 bound")]
    assert goal.met is None and goal.verdict == "n/a" and not goal.limits
    assert "dyn1ms: p99 3.0 ms vs bound 4.0 ms" in goal.measured
    assert (
        "dyn10ms: p99 could not be measured: no request answered (30 of 30 failed) vs bound" in goal.measured
    )
    family.open_loop["dyn1ms"] = _open_run("recommender_dyn1ms", True, 0.009)
    (goal,) = [g for g in all_goals(result) if g.name.startswith("Poisson p99 bound")]
    assert (
        goal.met is False and goal.limits.startswith("dyn1ms over by 5.0 ms") and "dyn10ms" not in goal.limits
    )
    report = write_report(result, tmp_path / "report").read_text()
    assert "| Poisson p99 bound (Poisson 200/s) |" in report and not re.search(
        r"\bnan\b", report, re.IGNORECASE
    )


def _closed_family(none_answered: bool, dyn10ms_answered: bool, dyn1ms_requests: int = 765) -> FamilyResult:
    """A closed loop at the goal concurrency whose server formed batches that fit ``T = 1, Δt = 0.2`` ms."""
    batches = {1: (50, 1.0), 8: (50, 2.4), 16: (50, 4.0)}
    runs = [("none", none_answered, 900, 1), ("dyn1ms", True, dyn1ms_requests, 4),
            ("dyn10ms", dyn10ms_answered, 90, 4)]  # fmt: skip
    family = FamilyResult("recommender")
    for mode, answered, requests, batch in runs:
        records = _records(f"recommender_{mode}", answered, requests, batch, 0.004)
        family.sweep[mode] = [_measurement(f"recommender_{mode}", records, _stats(batches))]
    return family


def test_dynamic_vs_none_is_not_measured_where_none_answered_nothing(result: StudyResult) -> None:
    family = _closed_family(none_answered=False, dyn10ms_answered=True)
    goal = analysis.dynamic_vs_none(result, family)
    assert goal.met is None and not goal.limits and goal.measured.startswith(f"dyn1ms: {UNMEASURED}")
    missed = analysis.dynamic_vs_none(result, _closed_family(none_answered=True, dyn10ms_answered=True))
    assert missed.met is False and missed.limits.startswith("best dyn1ms is 85% of the target")


def test_a_gain_check_with_no_answered_request_is_not_measured_not_missed(result: StudyResult) -> None:
    """dyn10ms formed batches on the server but its client counted no answer: no measured gain."""
    family = _closed_family(none_answered=True, dyn10ms_answered=False)
    _, gain = analysis.latency_model(result, family)
    assert "dyn1ms: predicted 3.38× vs measured 3.40× (-1%)" in gain.measured
    assert f"dyn10ms: predicted 1.14× vs measured 0.00× ({UNMEASURED}" in gain.measured
    assert gain.met is None and not gain.limits
    _, gain = analysis.latency_model(result, _closed_family(True, False, dyn1ms_requests=900))
    assert "dyn1ms: predicted 3.38× vs measured 4.00× (-16%)" in gain.measured
    assert gain.met is False and gain.limits == analysis.OVERHEAD_NOTE


def test_served_vs_raw_names_every_mode_that_met_it(result: StudyResult) -> None:
    """Raw onnxruntime gives 80 inferences/s at every batch: none (90/s) and dyn1ms (306/s) meet the
    goal, dyn10ms (36/s) does not, and the limits name both that met, not only the best."""
    family = _closed_family(none_answered=True, dyn10ms_answered=True)
    family.raw = [RawPoint(1, 1.0, 80.0, 0.1), RawPoint(16, 4.0, 80.0, 0.5)]
    goal = analysis.served_vs_raw(result, family)
    assert goal.met is True and goal.limits.startswith("met by none, dyn1ms only; below 0.9×: dyn10ms 0.45×")
