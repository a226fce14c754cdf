"""The model's CPU contention term: the CPU cost fit, the M/M/c wait and its slice calibrated from a
measured p99."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from perf.measure.loads import arrival_times, poisson
from perf.model.batcher import BatcherConfig, ServiceModel, simulate
from perf.model.cpu import CpuModel, erlang_c, fit_cpu_model
from perf.model.latency import slice_for
from perf.model.predict import max_rate


def test_the_cpu_fit_recovers_per_request_and_per_execution_costs() -> None:
    rng = np.random.default_rng(3)
    requests = rng.uniform(100, 3000, 20)
    executions = requests / rng.uniform(1, 8, 20)
    busy = 0.1 + 300e-6 * requests + 900e-6 * executions + rng.normal(0, 0.01, 20)
    model = fit_cpu_model(requests, executions, busy, cores=2)
    assert abs(model.per_request_s - 300e-6) < 30e-6
    assert abs(model.per_execution_s - 900e-6) < 90e-6
    assert abs(model.idle_cores - 0.1) < 0.05
    assert abs(model.utilization(1000, 250) - (0.1 + 0.3 + 0.225) / 2) < 0.03
    assert model.utilization(1e6, 1e6) == 0.97  # capped: the M/M/c wait diverges at 1


def test_a_negative_cost_is_dropped_and_the_rest_refitted() -> None:
    requests = np.array([100.0, 500, 1000, 2000])
    executions = np.array([100.0, 100, 100, 100])  # constant: no information, noise drives it negative
    busy = 0.0002 * requests - np.array([0.0, 0.01, -0.01, 0.0])
    model = fit_cpu_model(requests, executions, busy, cores=2)
    assert model.per_request_s > 0 and model.per_execution_s >= 0 and model.idle_cores >= 0
    nan_row = fit_cpu_model([*requests, 50.0], [*executions, 5.0], [*busy, float("nan")], cores=2)
    assert nan_row == model  # a run without a CPU reading is left out, not read as 0


def test_erlang_c_is_the_textbook_waiting_probability() -> None:
    assert erlang_c(1, 0.6) == pytest.approx(0.6)  # M/M/1: an arrival waits with probability ρ
    assert erlang_c(2, 0.5) == pytest.approx(2 * 0.5**2 / (1 + 0.5))  # M/M/2: 2ρ²/(1+ρ)
    assert erlang_c(2, 0.5) < erlang_c(1, 0.5)  # two cores: fewer arrivals find both busy


def test_the_wait_is_an_mmc_wait_at_the_utilization() -> None:
    model = CpuModel(0.0, 0.0, 0.0, cores=2, slice_s=0.001)
    assert not model.waits_s(0.0, 1000).any()
    assert not dataclasses.replace(model, slice_s=0.0).waits_s(0.6, 1000).any()
    waits = model.waits_s(0.6, 200_000)
    waiting = erlang_c(2, 0.6)
    assert abs(np.mean(waits > 0) - waiting) < 0.01
    mean = 0.001 / (2 * 0.4)  # Exp of mean s/(c(1-ρ))
    assert abs(waits[waits > 0].mean() - mean) < 0.05 * mean
    # P(W > t) = C·exp(-t/mean): the p99 is mean·ln(100·C)
    assert abs(np.percentile(waits, 99) - mean * math.log(100 * waiting)) < 0.1 * mean


def test_the_simulation_adds_the_wait_at_the_utilization_its_batches_put_on_the_cores() -> None:
    arrivals = arrival_times(poisson(800, seed=1), 4.0)
    config = BatcherConfig(8, 1000)
    plain = ServiceModel(0.001, 0.0002)
    cpu = CpuModel(0.1, 500e-6, 1e-3, cores=2, slice_s=0.002)
    without = simulate(arrivals, config, plain)
    with_wait = simulate(arrivals, config, dataclasses.replace(plain, cpu=cpu))
    expected = cpu.utilization(len(arrivals) / without.span_s, len(without.batch_sizes) / without.span_s)
    assert with_wait.cpu_utilization == expected and 0.3 < expected < 0.97
    assert np.array_equal(with_wait.batch_sizes, without.batch_sizes)  # the batcher is not changed
    waits = with_wait.latencies_s - without.latencies_s
    assert np.all(waits >= 0) and abs(np.mean(waits > 0) - erlang_c(2, expected)) < 0.05
    assert with_wait.p99_ms() > without.p99_ms()


def test_contention_lowers_the_rate_that_meets_a_budget() -> None:
    plain = ServiceModel(0.001, 0.0002)
    contended = dataclasses.replace(plain, cpu=CpuModel(0.1, 400e-6, 0.0, cores=2, slice_s=0.002))
    config = BatcherConfig(8, 1000)
    free, busy = max_rate(config, plain, 10.0), max_rate(config, contended, 10.0)
    assert free is not None and busy is not None
    assert busy.rate < 0.9 * free.rate
    assert busy.cpu_utilization > 0


def test_the_slice_calibration_recovers_the_slice_behind_a_p99() -> None:
    arrivals = arrival_times(poisson(1500, seed=2), 3.0)
    config = BatcherConfig(8, 0)
    service = ServiceModel(0.001, 0.0002, per_request_s=50e-6)
    cpu = CpuModel(0.05, 600e-6, 0.0, cores=2)
    truth = simulate(
        arrivals, config, dataclasses.replace(service, cpu=dataclasses.replace(cpu, slice_s=0.0015))
    )
    found = slice_for(arrivals, config, service, cpu, truth.p99_ms())
    assert abs(found - 0.0015) < 0.0001
    plain = simulate(arrivals, config, service).p99_ms()
    assert (
        slice_for(arrivals, config, service, cpu, 0.5 * plain) == 0.0
    )  # the batcher alone is already slower
