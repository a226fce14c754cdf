"""The tools beside the tuner, on the simulated server: the exhaustive sweep (every candidate measured,
the pick judged against the best) and steal_check's split of runs that hold the host's noise."""

from __future__ import annotations

import pytest
from simulated_server import Noise, SimulatedServer
from test_tune_pick import BUDGET_MS, GRID, KNEE

from perf.loads import poisson
from perf.model.batcher import BatcherConfig
from perf.noise import NoisePolicy
from perf.tune.probe import ProbePlan
from perf.tune.steal_check import summary
from perf.tune.sweep import CEILING, sweep, sweep_section
from perf.tune.tuner import TuneRequest, tune


@pytest.fixture(scope="module")
def tuned():
    server = SimulatedServer(KNEE, Noise(stolen_runs=0.0), seed=6)
    return server, tune(server, TuneRequest(BUDGET_MS, grid=GRID, predict_s=3.0), ProbePlan())


def test_the_sweep_bisects_every_candidate_and_judges_the_pick_against_the_best(tuned) -> None:
    server, result = tuned
    ceiling = CEILING * result.probe.capacity
    swept = sweep(server, result, lambda text: None)
    assert {c.config for c in swept} == set(GRID.candidates(BUDGET_MS))
    assert [c.rate for c in swept] == sorted((c.rate for c in swept), reverse=True)  # best first
    for candidate in swept:
        rates = [p.rate for p in candidate.points]
        assert rates[0] == pytest.approx(ceiling / 2) and len(rates) == 6  # a bisection of (0, ceiling]
        met = [p.rate for p in candidate.points if p.measured.meets(BUDGET_MS)]
        assert candidate.rate == max(met, default=0.0)  # a rate a run met the budget at, never a guess
        for earlier, later in zip(candidate.points, candidate.points[1:], strict=False):
            met_there = earlier.measured.meets(BUDGET_MS)
            assert (later.rate > earlier.rate) == met_there  # up after a pass, down after a miss
    text = "\n".join(sweep_section(result, swept))
    assert "| tuner pick |" in text and "| tuner time |" in text
    assert f"{result.chosen.label} " in text and f"vs {swept[0].config.label} " in text


def test_steal_check_sets_the_runs_that_hold_noise_apart() -> None:
    noise = NoisePolicy(remeasure=False)
    server = SimulatedServer(KNEE, Noise(stolen_runs=0.5, stall_ms=80.0), seed=7, policy=noise)
    server.prepare(BatcherConfig(8, 1000, instances=2))
    runs = [server.measure(poisson(1500.0, k), f"run {k}") for k in range(12)]
    stolen, others = summary(runs, BUDGET_MS, noise)
    assert int(stolen[1]) + int(others[1]) == 12 and int(stolen[1]) > 0 and int(others[1]) > 0
    assert len(server.runs) == 12  # nothing measured again
    assert int(stolen[2]) == int(stolen[1])  # an 80 ms stall on 2% of requests: every stolen run missed
