"""The tuner's CPU contention term: the machine's CPU readings, the CPU cost fit, the M/M/c wait and
its calibration from a measured p99."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import numpy as np
import pytest

from perf.loads import poisson
from perf.tune.batcher_sim import BatcherConfig, ServiceModel, simulate
from perf.tune.cpu import CpuModel, CpuTimes, busy_cores, erlang_c, fit_cpu_model
from perf.tune.measured import SweepEntry
from perf.tune.operating import Confirmation
from perf.tune.predict import arrival_array, max_rate
from perf.tune.probe import Calibration, ProbeResult, calibrate_cpu_wait, slice_for
from perf.tune.tuner import TuneRequest, recalibrate, recalibrated


def test_proc_stat_reads_and_busy_cores_is_the_busy_share_of_the_cores() -> None:
    now = CpuTimes.now()
    assert now is not None and 0 < now.busy <= now.total
    # half the jiffies busy on a 2-core share: one core busy
    assert busy_cores(CpuTimes(100, 1000), CpuTimes(600, 2000), cores=2) <= 2
    assert math.isnan(busy_cores(None, now))
    assert math.isnan(busy_cores(now, now))  # no time passed: no figure, not a 0


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
    arrivals = arrival_array(poisson(800, seed=1), 4.0)
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
    arrivals = arrival_array(poisson(1500, seed=2), 3.0)
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


def test_each_instance_count_gets_the_slice_its_own_runs_ask_for() -> None:
    """Runs whose p99 two different slices produced (one per instance count, as two instances'
    thread pools compete for the cores differently): each count's slice is recovered from its own
    runs, where one slice shared by both (the median of all runs) would miss both."""
    cpu = CpuModel(0.05, 600e-6, 0.0, cores=2)
    service = ServiceModel(0.001, 0.0002, per_request_s=50e-6)
    truth = {1: 0.002, 2: 0.0005}
    calibrations = []
    for instances, slice_s in truth.items():
        config = BatcherConfig(8, 0, instances=instances)
        for rate in (1200, 1500, 1800):
            arrivals = arrival_array(poisson(rate, seed=2), 3.0)
            run = simulate(
                arrivals, config, dataclasses.replace(service, cpu=dataclasses.replace(cpu, slice_s=slice_s))
            )
            requests, executions = len(arrivals) / run.span_s, len(run.batch_sizes) / run.span_s
            busy = cpu.utilization(requests, executions) * cpu.cores
            observed = SimpleNamespace(
                p99_ms=run.p99_ms(),
                stolen_share=0.0,
                cpu_load=lambda r=requests, e=executions, b=busy: (r, e, b),
            )
            calibrations.append(Calibration(config, arrivals, [observed]))
    models = calibrate_cpu_wait(calibrations, {1: service, 2: service})
    for instances, slice_s in truth.items():
        assert abs(models[instances].slice_s - slice_s) < 0.15 * slice_s, (instances, models[instances])
    for calibration in calibrations:  # each run's prediction is its measured p99 again
        assert (
            abs(calibration.predicted_p99_ms - calibration.measured.p99_ms)
            < 0.1 * calibration.measured.p99_ms
        )


def test_the_pick_is_recalibrated_on_the_median_slice_of_its_kept_up_shortlist_runs_only() -> None:
    """Three shortlist runs of the pick kept up: one measured what a 1.5 ms slice gives at 1500/s,
    one (a lucky pass) 0.8x what it gives at 1200/s, one 1.4x at 1800/s; each run's own slice
    reproduces its p99, and their median (the 1500/s run's, 1.5 ms) is the slice. A run the server
    fell far behind on (its p99 is its backlog) does not count, nor does one whose p99 the simulation
    reaches without any wait (its slice is 0: it only says "at most 0"). The verification predicts
    with it for the pick's instance count; other counts and the probe's own models stay as they were."""
    cpu = CpuModel(0.05, 600e-6, 0.0, cores=2)
    probe_cpu = {1: dataclasses.replace(cpu, slice_s=0.0002), 2: dataclasses.replace(cpu, slice_s=0.0007)}
    service = ServiceModel(0.001, 0.0002, per_request_s=50e-6)
    services = {n: dataclasses.replace(service, cpu=model) for n, model in probe_cpu.items()}
    probed = ProbeResult(services, {}, 0.0, {}, tails=dict(services), cpu=probe_cpu)
    config = BatcherConfig(8, 0)
    request = TuneRequest(10.0)
    truth = dataclasses.replace(service, cpu=dataclasses.replace(cpu, slice_s=0.0015))

    def run(rate: float, factor: float, served: float | None = None) -> SimpleNamespace:
        p99 = simulate(arrival_array(request.load(rate), 3.0), config, truth).p99_ms()
        return SimpleNamespace(p99_ms=factor * p99, offered=rate, throughput=served or rate, stolen_share=0.0)

    runs = [run(1500, 1.0), run(1200, 0.8), run(1800, 1.4), run(2400, 30.0, served=1000), run(1800, 0.05)]
    entry = SweepEntry(
        config, 1500, runs, 10.0, passed_run=runs[1], point_s=3.0, rates=[1500, 1200, 1800, 2400, 1800]
    )
    found = recalibrate(probed, request, config, [entry])
    assert found is not None and found.instances == 1 and found.rate == 1500
    kept = [runs[0], runs[1], runs[2], runs[4]]  # the overloaded run is not one of them
    assert [(r.rate, r.p99_ms) for r in found.runs] == [(x.offered, x.p99_ms) for x in kept]
    lucky, high, reached = (found.runs[k].slice_s for k in (1, 2, 3))
    assert lucky < 0.0012 and high > 0.0018 and reached == 0.0  # each run's own slice
    assert abs(found.slice_s - 0.0015) < 0.0001 and found.probe_slice_s == 0.0002
    verifying = recalibrated(probed, found)
    assert verifying.services[1].cpu.slice_s == verifying.tails[1].cpu.slice_s == found.slice_s
    assert verifying.services[2].cpu.slice_s == 0.0007 and verifying.cpu[2].slice_s == 0.0007
    assert probed.services[1].cpu.slice_s == 0.0002  # the ranking's and the report's probe stay
    missed = SweepEntry(config, 0.0, runs[:1], 10.0, missed_at=1500, point_s=3.0, rates=[1500])
    assert recalibrate(probed, request, config, [missed]) is None
    assert recalibrated(probed, None) is probed
    # the confirmation's runs at the operating rate count too: two at 1275/s measuring twice what
    # the 1.5 ms slice gives there pull the median of three above 1.5 ms
    doubled = tuple(run(1275, 2.0) for _ in range(2))
    confirmation = Confirmation(1275, False, (1275, 1275), doubled, 3.0, 7.0)
    with_confirmation = recalibrate(
        probed, request, config, [dataclasses.replace(entry, points=runs[:1], rates=[1500])], confirmation
    )
    assert with_confirmation is not None and [r.rate for r in with_confirmation.runs] == [1500, 1275, 1275]
    assert with_confirmation.slice_s > 0.0018
