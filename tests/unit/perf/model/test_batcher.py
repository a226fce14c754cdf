"""The batcher simulation against cases computed by hand (times in ms in the comments)."""

from __future__ import annotations

import numpy as np
import pytest

from perf.measure.loads import arrival_times, poisson
from perf.model.batcher import BatcherConfig, ServiceModel, simulate
from perf.model.latency import LatencyFit, fit_compute, per_batch_and_request_ms
from perf.model.predict import max_rate, predict


def ms(values: np.ndarray) -> list[float]:
    return [round(float(v) * 1e3, 6) for v in values]


def test_a_full_batch_leaves_without_waiting_for_the_delay() -> None:
    # 4 arrivals at 0,1,2,3; the 4th fills max 4 at 3 (delay 10 never expires); takes 10 + 3·1 = 13.
    result = simulate([0, 0.001, 0.002, 0.003], BatcherConfig(4, 10_000), ServiceModel(0.010, 0.001))
    assert result.batch_sizes.tolist() == [4]
    assert ms(result.latencies_s) == [16, 15, 14, 13]


def test_a_partial_batch_leaves_when_the_oldest_has_waited_the_delay() -> None:
    # arrivals 0 and 1, delay 5: leaves at 5 with 2, takes 2: done at 7.
    result = simulate([0, 0.001], BatcherConfig(8, 5_000), ServiceModel(0.002, 0.0))
    assert result.batch_sizes.tolist() == [2]
    assert ms(result.latencies_s) == [7, 6]


def test_two_instances_run_side_by_side_and_the_third_request_waits() -> None:
    # no batching, 3 arrivals at 0, each taking 10: two finish at 10, the third runs from 10 to 20.
    result = simulate([0, 0, 0], BatcherConfig(1, 0, instances=2), ServiceModel(0.010, 0.0))
    assert result.batch_sizes.tolist() == [1, 1, 1]
    assert ms(result.latencies_s) == [10, 10, 20]


def test_arrivals_during_a_run_wait_and_leave_together_when_the_instance_frees() -> None:
    # delay 0: 0 runs alone 0..10; 2,4,6 arrive during it and leave together at 10 (runs to 20);
    # 12 arrives during that run and leaves alone at 20 (to 30).
    result = simulate([0, 0.002, 0.004, 0.006, 0.012], BatcherConfig(4, 0), ServiceModel(0.010, 0.0))
    assert result.batch_sizes.tolist() == [1, 3, 1]
    assert ms(result.latencies_s) == [10, 18, 16, 14, 18]


def test_a_preferred_size_leaves_at_once_and_the_rest_waits_for_the_delay() -> None:
    # preferred 2: arrivals 0,1 leave at 1 (take 5, done 6); 2 finds the instance busy until 6, then waits
    # for its delay (2 + 100 = 102) and runs to 107. Overhead 1 ms is added to every request.
    config = BatcherConfig(8, 100_000, preferred_batch_sizes=(2,))
    result = simulate([0, 0.001, 0.002], config, ServiceModel(0.005, 0.0, overhead_s=0.001))
    assert result.batch_sizes.tolist() == [2, 1]
    assert ms(result.latencies_s) == [7, 6, 106]


def test_a_batch_takes_the_largest_preferred_size_reached() -> None:
    # 5 pending when the instance frees, preferred 2 and 4: a batch of 4, then the 5th alone after its delay.
    arrivals = [0, 0.0001, 0.0002, 0.0003, 0.0004]
    config = BatcherConfig(8, 1_000, preferred_batch_sizes=(2, 4))
    result = simulate(arrivals, config, ServiceModel(0.001, 0.0))
    assert result.batch_sizes.tolist()[:1] == [2]  # 2 arrive with the instance idle: preferred 2 at once
    result = simulate([0, 0, 0, 0, 0], config, ServiceModel(0.001, 0.0))
    assert result.batch_sizes.tolist() == [4, 1]


def test_config_rejects_impossible_values_naming_the_field() -> None:
    with pytest.raises(ValueError, match="preferred_batch_sizes"):
        BatcherConfig(4, preferred_batch_sizes=(8,))
    with pytest.raises(ValueError, match="max_queue_delay_us"):
        BatcherConfig(4, -1)


def test_batching_sustains_more_than_no_batching_when_t_dominates() -> None:
    service = ServiceModel(0.004, 0.0002)
    single = max_rate(BatcherConfig(1), service, budget_ms=20)
    batched = max_rate(BatcherConfig(16, 1_000), service, budget_ms=20)
    assert single is not None and batched is not None
    assert single.rate < 250  # one instance at 4 ms a request cannot pass 250/s
    assert batched.rate > 2 * single.rate


def test_per_request_cost_lengthens_every_run() -> None:
    # T 2 + 1 per extra sample + 0.5 per request: a batch of 2 takes 2 + 1 + 1 = 4 ms.
    result = simulate([0, 0], BatcherConfig(2, 0), ServiceModel(0.002, 0.001, per_request_s=0.0005))
    assert ms(result.latencies_s) == [4, 4]


def test_prediction_flags_an_overloaded_server() -> None:
    service = ServiceModel(0.010, 0.0)
    overloaded = predict(BatcherConfig(1), service, poisson(200.0), seconds=3)
    assert not overloaded.sustained and not overloaded.meets(1e9)
    assert len(arrival_times(poisson(100.0), 2.0)) == pytest.approx(200, rel=0.25)


def test_calibration_splits_per_execution_and_per_request_costs() -> None:
    fit = LatencyFit(1.0, 0.1, 1.0, {})
    # truth: 0.5 ms per execution, 0.05 per request. batch 1 busy 1 + 0.5 + 0.05; batch 20: 2.9 + 0.5 + 1.0
    per_batch, per_request = per_batch_and_request_ms((1.0, 1.55), (20.0, 4.4), fit)
    assert per_batch == pytest.approx(0.5) and per_request == pytest.approx(0.05)
    assert ServiceModel(0.001, 0.0001, per_request_s=0.00005, per_batch_s=0.0005).exec_s(20) == pytest.approx(
        0.0044
    )


def test_the_batcher_records_when_each_batch_left_the_queue() -> None:
    # delay 0, runs of 10: 0 leaves at 0; 2 and 4 wait for the instance and leave together at 10.
    result = simulate([0, 0.002, 0.004], BatcherConfig(8, 0), ServiceModel(0.010, 0.0))
    assert result.batch_sizes.tolist() == [1, 2]
    assert ms(result.starts_s) == [0, 10]


def test_a_compute_fit_that_is_no_cost_gives_way_to_the_line_through_the_ends() -> None:
    # small batches slowed by a neighbour: a negative slope, no cost model; the slope is kept at 0
    fit = fit_compute({1: 5.0, 2: 4.0, 8: 3.0}, {1: 10, 2: 10, 8: 10})
    assert (fit.t_ms, fit.dt_ms) == (5.0, 0.0)
    # only large sizes, steep: a negative T; the line through the ends, or the smallest size flat
    fit = fit_compute({4: 1.0, 8: 5.0}, {4: 1, 8: 1})
    assert fit.t_ms > 0 and fit.dt_ms >= 0
    exact = fit_compute({1: 2.0, 4: 2.3, 8: 2.7}, {1: 5, 4: 5, 8: 5})
    assert exact.t_ms == pytest.approx(2.0) and exact.dt_ms == pytest.approx(0.1)
