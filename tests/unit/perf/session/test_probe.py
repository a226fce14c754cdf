"""The probe against a simulated server whose service is known and whose runs carry no noise: what it
measures must be that service again (compute per batch size, what lies outside the server, the CPU
costs, and each instance count's own CPU-wait slice)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from client.stats import ModelStats
from perf.model.batcher import BatcherConfig, ServiceModel
from perf.model.cpu import CpuModel
from perf.session.probe import ProbePlan, _ramp, probe
from perf.session.search import FAR_MISS
from tests.unit.perf.simulated_server import Noise, SimulatedServer

CPU = CpuModel(idle_cores=0.1, per_request_s=150e-6, per_execution_s=200e-6, cores=2)
# two instances' threads compete for the cores more: a longer slice, as measured on two cores
TRUTH = {
    1: ServiceModel(1.7e-3, 0.06e-3, 0.08e-3, 0.5e-3, 0.4e-3, dataclasses.replace(CPU, slice_s=0.0002)),
    2: ServiceModel(1.9e-3, 0.08e-3, 0.15e-3, 0.5e-3, 0.4e-3, dataclasses.replace(CPU, slice_s=0.0008)),
}
QUIET = Noise(run_factor=0.0, tail_ms=1e-6, stolen_runs=0.0)


@pytest.fixture(scope="module")
def probed():
    server = SimulatedServer(TRUTH, QUIET, seed=5)
    return probe(server, (1, 2), 32, ProbePlan()), server


def test_the_probe_ramps_each_instance_count_until_the_server_falls_behind_twice(probed) -> None:
    result, server = probed
    assert set(result.saturation) == {0, 1, 2}  # 0: without batching
    for instances, run in result.saturation.items():
        ramp = [
            r for c, r in result.runs if c.instances == (instances or 1) and c.batching == bool(instances)
        ]
        if instances == 1:
            ramp = ramp[1:]  # the first run, at a trickle, says where the ramp starts
        kept_up, last_two = ramp[:-2], ramp[-2:]
        assert all(r.sustained for r in kept_up) and not any(r.sustained for r in last_two)
        assert run is max(last_two, key=lambda r: r.throughput)  # the saturation: the one served most
        assert last_two[0].load.rate == last_two[1].load.rate  # measured again, never deeper in overload
        rates = [r.load.rate for r in ramp]
        assert rates == sorted(rates)
    assert len(server.runs) == len(result.runs)


class Disturbed:
    """Keeps up to 1,000/s, except the first run at ``disturbed``/s (a neighbour's burst)."""

    cores = 2

    def __init__(self, disturbed: float) -> None:
        self.disturbed = disturbed
        self.rates: list[float] = []

    def prepare(self, config) -> None:
        pass

    def measure(self, load, label):
        self.rates.append(load.rate)
        kept_up = load.rate <= 1000 and not (load.rate == self.disturbed and self.rates.count(load.rate) == 1)
        served = load.rate if kept_up else min(load.rate, 1000) / 2
        return SimpleNamespace(
            label=label, sustained=kept_up, throughput=served, stats=ModelStats(), load=load, p99_ms=5.0
        )


def test_one_run_a_neighbour_disturbed_does_not_end_the_ramp() -> None:
    server, runs = Disturbed(disturbed=320.0), []
    saturated = _ramp(server, BatcherConfig(8), 200.0, ProbePlan(step=1.6), runs)
    assert server.rates == pytest.approx([200, 320, 320, 512, 819.2, 1310.72, 1310.72])
    assert saturated.throughput == 500  # behind twice at 1,311/s: the more served of the two


def test_a_run_far_over_the_budget_ends_the_ramp_once_measured_again() -> None:
    """Given the budget, a run whose p99 is over ``FAR_MISS`` × it stops the ramp's rate (deeper overload
    only makes runs long): measured once more at that rate, as a run the server fell behind on is."""

    class Slowing(Disturbed):
        def measure(self, load, label):
            run = super().measure(load, label)
            run.p99_ms = 5.0 if load.rate < 500 else 50.0  # sustained, but far over a 10 ms budget
            return run

    server, runs = Slowing(disturbed=-1.0), []
    ended = _ramp(server, BatcherConfig(8), 200.0, ProbePlan(step=1.6), runs, budget_ms=10.0)
    assert FAR_MISS * 10.0 < 50.0 and server.rates == pytest.approx([200, 320, 512, 512])
    assert ended.load.rate == 512  # a run over the bound stands for the saturation


def test_the_probe_measures_the_known_service_again(probed) -> None:
    result, _ = probed
    for instances, truth in TRUTH.items():
        fit, service = result.fits[instances], result.services[instances]
        # what the server reports as compute is the whole execution: T + (N-1)·Δt of exec_s
        assert fit.t_ms == pytest.approx(1e3 * truth.exec_s(1), rel=0.02)
        assert fit.dt_ms == pytest.approx(1e3 * (truth.exec_s(2) - truth.exec_s(1)), rel=0.05)
        assert service.exec_s(16) == pytest.approx(truth.exec_s(16), rel=0.05)
    assert result.overhead_ms == pytest.approx(0.5, abs=0.15)  # outside the server, at a trickle
    cpu = result.cpu
    assert cpu.per_request_s == pytest.approx(CPU.per_request_s, rel=0.15)
    assert cpu.per_execution_s == pytest.approx(CPU.per_execution_s, rel=0.25)


def test_each_instance_count_gets_the_cpu_wait_its_own_runs_ask_for(probed) -> None:
    result, _ = probed
    one, two = (result.services[n].cpu.slice_s for n in (1, 2))
    assert one < two  # one slice shared by both counts would miss both
    assert two == pytest.approx(TRUTH[2].cpu.slice_s, rel=0.5)
