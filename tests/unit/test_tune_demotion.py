"""The answer is what was measured: a pick whose verification misses the budget at its operating rate,
by however little, is demoted and the next measured candidate takes its place; where nothing measured
meets the budget the tuner says so in one line with the closest figure, and ``make tune`` exits 3
without writing ``spec.tuned.yaml``. Checked on the simulated server (the truth known) behind the same
``Server`` interface as the real session, and on the CLI with the tuner's verdict."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console
from simulated_server import KneeService, Noise, SimulatedServer
from test_tune_pick import BUDGET_MS, GRID, LINEAR

from perf.cli import main
from perf.errors import EXIT_NOTHING_MEETS, NothingMeetsError
from perf.measure.loads import Load
from perf.measure.measurement import Measurement
from perf.model.batcher import BatcherConfig
from perf.session.probe import ProbePlan
from perf.tune import cli as tune_cli
from perf.tune.tuner import TuneRequest, tune

MISS_MS = 0.2  # how far over the budget a demoted pick's verification lands: 10.2 ms against 10


class MissingVerification(SimulatedServer):
    """The simulated server, except that every verification run of the ``victims`` comes out
    ``MISS_MS`` over the budget at p99 (the 50.2-against-50 ms case): every latency shifted by the
    difference, as a host that slowed down after the shortlist would."""

    def __init__(self, truth: dict[int, KneeService], victims: set[BatcherConfig] | None, **kwargs) -> None:
        super().__init__(truth, Noise(), **kwargs)
        self.victims = victims  # None: every configuration

    def _run(self, load: Load, label: str) -> Measurement:
        run = super()._run(load, label)
        if not label.startswith("verify") or (self.victims is not None and self.current not in self.victims):
            return run
        shift_s = (BUDGET_MS + MISS_MS - run.p99_ms) / 1e3
        shifted = [dataclasses.replace(r, recv_s=r.recv_s + shift_s) for r in run.records]
        run = self.runs[-1] = dataclasses.replace(run, records=shifted)
        assert run.p99_ms > BUDGET_MS and not run.meets(BUDGET_MS)
        return run


def tuned(victims: set[BatcherConfig] | None, seed: int = 1, rate: float | None = None):
    server = MissingVerification(LINEAR, victims, seed=seed)
    return tune(server, TuneRequest(BUDGET_MS, rate=rate, grid=GRID, predict_s=3.0), ProbePlan())


@pytest.fixture(scope="module")
def unhindered():
    """The tune as it goes with no verification missing: its pick is the one to demote."""
    return tuned(victims=set())


def test_a_pick_whose_verification_misses_is_never_the_answer(unhindered) -> None:
    first = unhindered.chosen
    assert not unhindered.demoted and unhindered.operating_point.measured.meets(BUDGET_MS)
    result = tuned(victims={first})  # the same seed: the same probe, shortlist and pick until verified
    assert [p.config for p in result.demoted] == [first]
    assert result.demoted[0].measured.p99_ms == pytest.approx(BUDGET_MS + MISS_MS, abs=0.05)
    assert result.chosen != first
    # the next measured candidate took its place: one the shortlist measured to sustain the budget
    sustained = {c.config: c.rate for c in result.shortlist}
    assert sustained[result.chosen] > 0 and sustained[result.chosen] <= sustained[first]


def test_the_reported_rate_is_one_a_run_met_the_budget_at(unhindered) -> None:
    result = tuned(victims={unhindered.chosen})
    operating = result.operating_point
    assert operating.config == result.chosen and operating.rate == result.operating_rate
    assert operating.measured is not None and operating.measured.meets(BUDGET_MS)
    assert result.operating_rate < max(c.rate for c in result.shortlist if c.config == result.chosen)


def test_with_a_target_rate_a_pick_missing_it_is_demoted_too(unhindered) -> None:
    target = 1500.0
    first = tuned(victims=set(), rate=target).chosen
    result = tuned(victims={first}, rate=target)
    assert result.chosen != first and result.operating_rate == target
    assert result.operating_point.measured.meets(BUDGET_MS)


def test_where_nothing_measured_meets_the_verdict_is_one_line_with_the_closest_figure() -> None:
    with pytest.raises(NothingMeetsError) as caught:
        tuned(victims=None)  # every verification misses: every contender demoted
    verdict = str(caught.value)
    assert "\n" not in verdict
    assert verdict.startswith(f"nothing meets p99 <= {BUDGET_MS:g} ms here: the closest measured was max ")
    # the closest is the lowest p99 the tuner measured: a search run within the budget (and the line
    # says why it is no answer all the same), or a miss
    p99 = float(re.search(r"/s with p99 ([\d.,]+) ms", verdict).group(1).replace(",", ""))
    if p99 <= BUDGET_MS:
        assert verdict.endswith(
            "(a search run met the budget there; the verification at the operating rate missed it)"
        )
    else:
        assert verdict.endswith(" ms")


def test_when_no_candidate_is_predicted_within_the_budget_the_verdict_names_the_probe_s_best() -> None:
    """A model far slower than the budget: the probe's own runs are the closest figures measured."""
    slow = {n: dataclasses.replace(s, t_s=30e-3) for n, s in LINEAR.items()}
    server = SimulatedServer(slow, Noise(), seed=2)
    with pytest.raises(
        NothingMeetsError, match=r"^nothing meets p99 <= 10 ms here: the closest measured was "
    ):
        tune(server, TuneRequest(BUDGET_MS, grid=GRID, predict_s=3.0), ProbePlan(max_runs=4))
    lowest = min(run.p99_ms for run in server.runs)
    assert np.isfinite(lowest) and lowest > BUDGET_MS


def test_make_tune_exits_3_and_writes_no_tuned_spec_when_nothing_meets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """``python -m perf tune`` as ``make tune`` runs it, the tuning itself replaced by the simulated
    server's verdict (no real server here): exit 3, the one line printed, no spec written as answer."""

    def nothing_meets(args, spec, folder, console, beside=None, setup=None):
        server = MissingVerification(LINEAR, None, seed=1)
        with tune_cli.partial_on_failure(folder, "Tuning recommender", server):
            tune(server, TuneRequest(BUDGET_MS, grid=GRID, predict_s=3.0), ProbePlan())

    monkeypatch.setattr(tune_cli, "measure_and_pick", nothing_meets)
    monkeypatch.setattr("perf.cli.console", Console(width=300))
    reports = tmp_path / "reports"
    code = main(
        ["tune", "--model", "recommender", "--p99-ms", "10", "--engine", "ours", "--reports", str(reports)]
    )
    assert code == EXIT_NOTHING_MEETS == 3
    printed = capsys.readouterr().out
    assert "nothing meets p99 <= 10 ms here: the closest measured was" in printed
    (folder,) = reports.iterdir()
    assert not (folder / "spec.tuned.yaml").exists() and not (folder / "overlay.yaml").exists()
    partial = (folder / "partial.md").read_text()
    assert partial.startswith("# Tuning recommender: no answer") and "Nothing below is an answer" in partial


def test_make_tune_exits_2_on_a_spec_it_cannot_read(tmp_path: Path) -> None:
    """A usage or spec error (2) is kept apart from a failed run (1) and from "nothing meets" (3)."""
    missing = tmp_path / "missing.yaml"
    args = ["tune", "--spec", str(missing), "--model", "m", "--p99-ms", "10", "--reports", str(tmp_path)]
    assert main(args) == 2


def test_the_result_keeps_each_step_s_time_apart(unhindered) -> None:
    """The saved seconds of each step are what each took (the shortlist's not filed as the prediction's)."""
    assert unhindered.predict_s > 0 and unhindered.shortlist_s > 0 and unhindered.verify_s > 0
    assert unhindered.demoted == []


class FirstVerificationMisses(MissingVerification):
    """Verification runs at the first rate verified miss (a host slower for a moment; the noise
    policy's rematch of that run misses too); every other run as measured: the tuner tries the same
    pick lower before it demotes it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.first_rate: str | None = None

    def _run(self, load: Load, label: str) -> Measurement:
        if label.startswith("verify"):
            rate = label.rsplit("@", 1)[1]
            self.first_rate = self.first_rate or rate
            if rate != self.first_rate:
                return SimulatedServer._run(self, load, label)
        return super()._run(load, label)


def test_a_pick_that_misses_once_is_verified_lower_before_it_is_demoted(unhindered) -> None:
    server = FirstVerificationMisses(LINEAR, {unhindered.chosen}, seed=1)
    result = tune(server, TuneRequest(BUDGET_MS, grid=GRID, predict_s=3.0), ProbePlan())
    assert result.chosen == unhindered.chosen and not result.demoted
    assert result.operating_rate == pytest.approx(0.7 * unhindered.operating_rate)
    assert result.operating_point.measured.meets(BUDGET_MS)
    missed = [p for p in result.points if p.rate == pytest.approx(unhindered.operating_rate)]
    assert missed and not missed[0].measured.meets(BUDGET_MS)  # the miss is kept in the result
