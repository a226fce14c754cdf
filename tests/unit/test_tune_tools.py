"""The tools beside the tuner, on the simulated server: steal_check's split of runs that hold the host's
noise."""

from __future__ import annotations

from simulated_server import Noise, SimulatedServer
from test_tune_pick import BUDGET_MS, KNEE

from perf.bench.steal_check import summary
from perf.measure.loads import poisson
from perf.measure.noise import NoisePolicy
from perf.model.batcher import BatcherConfig


def test_steal_check_sets_the_runs_that_hold_noise_apart() -> None:
    noise = NoisePolicy(remeasure=False)
    server = SimulatedServer(KNEE, Noise(stolen_runs=0.5, stall_ms=80.0), seed=7, policy=noise)
    server.prepare(BatcherConfig(8, 1000, instances=2))
    runs = [server.measure(poisson(1500.0, k), f"run {k}") for k in range(12)]
    stolen, others = summary(runs, BUDGET_MS, noise)
    assert int(stolen[1]) + int(others[1]) == 12 and int(stolen[1]) > 0 and int(others[1]) > 0
    assert len(server.runs) == 12  # nothing measured again
    assert int(stolen[2]) == int(stolen[1])  # an 80 ms stall on 2% of requests: every stolen run missed
