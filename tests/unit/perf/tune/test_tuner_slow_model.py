"""A slow model in the tuner, on the simulated server (the truth known): no candidate's full batch
computes for longer than the budget, and a tune that fails part-way leaves a report of what it measured."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from rich.console import Console

from perf.errors import NothingMeetsError, StudyError
from perf.markdown import number
from perf.measure.loads import Load
from perf.measure.measurement import Measurement
from perf.model.batcher import BatcherConfig
from perf.model.grid import Grid
from perf.session.probe import ProbePlan, probe
from perf.tune.cli import partial_on_failure, print_summary
from perf.tune.result import document
from perf.tune.tuner import TuneRequest, compute_ms, rank, tune, why_none
from tests.unit.perf.scripted_server import ScriptedServer
from tests.unit.perf.simulated_server import TWO_CORES, KneeService, Noise, SimulatedServer

BUDGET_MS = 200.0
GRID = Grid(delays_us=(0, 5000, 20000), max_batches=(8, 32), instances=(1, 2))
# vit_tiny-like: a batch of 8 takes 110 ms, a batch of 32 350 ms (a full batch alone misses 200 ms);
# a second instance shares the two cores, each batch taking longer.
SLOW = {
    1: KneeService(40e-3, 10e-3, 0.1e-3, 1e-3, 0.5e-3, TWO_CORES),
    2: KneeService(55e-3, 14e-3, 0.1e-3, 1e-3, 0.5e-3, TWO_CORES),
}
PLAN = ProbePlan(first_rate=2.0, step=1.6, max_runs=8)


def test_the_tuner_proposes_no_batch_whose_compute_exceeds_the_budget() -> None:
    server = SimulatedServer(SLOW, Noise(), seed=1, seconds=20.0)
    result = tune(server, TuneRequest(BUDGET_MS, grid=GRID, predict_s=20.0, shortlist=2), PLAN)
    compute = compute_ms(result.probe)
    sizes = {r.config.max_batch_size for r in result.ranking}
    assert 32 not in sizes and max(sizes) > 8  # 32 bounded to what fits, not dropped to nothing
    assert all(compute(n) <= BUDGET_MS for n in sizes)
    # by the truth, too (the fit is measured, so within the noise of a measurement)
    truth = SLOW[result.chosen.instances]
    assert 1e3 * truth.compute_s(result.chosen.max_batch_size) <= 1.1 * BUDGET_MS
    assert all(1e3 * SLOW[2].compute_s(n) <= 1.1 * BUDGET_MS for n in sizes)


def test_a_budget_no_batch_of_two_fits_leaves_no_batching_only() -> None:
    grid = Grid(max_batches=(8, 32), instances=(1,))
    compute = SLOW[1].compute_s
    assert grid.batch_sizes(45.0, lambda n: 1e3 * compute(n)) == ()
    assert {c.max_batch_size for c in grid.candidates(45.0, lambda n: 1e3 * compute(n))} == {1}
    assert grid.batch_sizes(200.0, lambda n: 1e3 * compute(n)) == (8, 17)


class FailingServer(SimulatedServer):
    """Fails the way perf_analyzer did on a slow model, after ``after`` runs."""

    def __init__(self, *args, after: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.after = after

    def measure(self, load: Load, label: str) -> Measurement:
        if len(self.runs) >= self.after:
            raise StudyError(
                f"perf_analyzer failed on {label}: No valid requests recorded within time interval"
            )
        return super().measure(load, label)


def test_a_tune_that_fails_part_way_writes_what_it_measured(tmp_path: Path) -> None:
    server = FailingServer(SLOW, Noise(), seed=1, seconds=20.0, after=3)
    with (
        pytest.raises(StudyError, match="No valid requests"),
        partial_on_failure(tmp_path, "Tuning slow", server),
    ):
        tune(server, TuneRequest(BUDGET_MS, grid=GRID, predict_s=20.0), PLAN)
    text = (tmp_path / "partial.md").read_text()
    assert text.startswith("# Tuning slow: stopped before the pick")
    assert "**StudyError**: perf_analyzer failed on probe" in text
    assert "3 runs were measured before it" in text
    assert text.count("| probe ") == 3


def test_a_grid_left_empty_by_the_bound_is_nothing_meets_with_the_reason() -> None:
    """Every candidate ruled out by what the probe measured is the tool's answer "nothing meets" (exit 3),
    with the closest probe run, not a runtime error."""
    server = SimulatedServer(SLOW, Noise(), seed=2, seconds=20.0)
    grid = Grid(delays_us=(0,), max_batches=(8,), instances=(1,), no_batching=False)
    with pytest.raises(
        NothingMeetsError, match=r"^nothing meets p99 <= 45 ms here: the closest measured"
    ) as caught:
        tune(server, TuneRequest(45.0, grid=grid, predict_s=20.0), PLAN)
    assert "no candidate: even a batch of 2 computes for longer than the 45 ms" in caught.value.detail


def test_a_grid_left_empty_by_the_bound_still_answers_with_a_probe_run_that_held_it(tmp_path: Path) -> None:
    """The same empty grid, on a server scripted to hold the budget up to 30/s: the probe's runs at its
    lowest rates met it, so the probe's configuration is searched and is the answer, and its document is
    written (the prediction ranked nothing), and the console names the measured rate as the answer."""
    server = ScriptedServer(SLOW, 45.0, lambda config: 30.0, seed=2, seconds=20.0)
    grid = Grid(delays_us=(0,), max_batches=(8,), instances=(1,), no_batching=False)
    result = tune(server, TuneRequest(45.0, grid=grid, predict_s=20.0), PLAN)
    assert result.ranking == [] and result.chosen == BatcherConfig(8, 0)
    assert 0 < result.measured_rate <= 30.0
    saved = document(result, "slow", "ours", server.policy, server.cores)
    assert saved.model_pick == "no candidate" and saved.predicted_max_rate is None
    console = Console(record=True, width=400)
    print_summary(saved, tmp_path / "report", console)
    summary = console.export_text()
    assert f"measured within p99 45 ms up to {number(saved.measured_max_rate, 0)}/s" in summary
    assert "the prediction (not a measurement): no candidate within the budget (the rate measured" in summary


def test_why_nothing_is_proposed_prints_no_negative_fit_as_a_figure() -> None:
    """A least-squares T below zero (as a Paddle classifier's came out) is no time a batch of one
    takes: the verdict's detail says it could not be measured instead of printing it."""
    probed = probe(SimulatedServer(SLOW, Noise(), seed=1, seconds=5.0), (1,), 32, PLAN)
    request = TuneRequest(BUDGET_MS, grid=Grid(max_batches=(8,), instances=(1,)))
    ranking = rank(probed, request)
    fit = probed.fits[1]
    text = why_none(probed, request, ranking)
    assert f"a batch of one: {fit.t_ms:.2f} ms computing" in text
    negative = dataclasses.replace(probed, fits={1: dataclasses.replace(fit, t_ms=-0.182)})
    text = why_none(negative, request, ranking)
    assert "a batch of one: could not be measured: came out negative" in text and "-0.18" not in text
