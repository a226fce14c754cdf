"""T_batch(N) = T + (N-1)·Δt: the fit recovers known parameters and predicts throughput and gain."""

import numpy as np
import pytest

from perf.model.latency import fit_latency


def test_fit_recovers_exact_line():
    points = {n: 2.0 + (n - 1) * 0.25 for n in (1, 2, 4, 8, 16, 32)}
    fit = fit_latency(points)
    assert fit.t_ms == pytest.approx(2.0)
    assert fit.dt_ms == pytest.approx(0.25)
    assert fit.r2 == pytest.approx(1.0)
    assert fit.throughput(1) == pytest.approx(500.0)
    assert fit.throughput(32) == pytest.approx(1000 * 32 / (2.0 + 31 * 0.25))


def test_noisy_points_lower_r2():
    rng = np.random.default_rng(0)
    points = {n: 2.0 + (n - 1) * 0.25 + rng.normal(0, 1.0) for n in range(1, 33)}
    assert fit_latency(points).r2 < 0.97


def test_throughput_follows_the_formed_histogram():
    fit = fit_latency({1: 2.0, 9: 4.0})  # T = 2, Δt = 0.25
    # Half the executions at batch 1, half at batch 9: 10 samples in 2 + 4 = 6 ms.
    assert fit.throughput_for({1: 1, 9: 1}) == pytest.approx(1000 * 10 / 6)


def test_fit_needs_two_batch_sizes():
    with pytest.raises(ValueError, match="two batch sizes"):
        fit_latency({4: 1.0})


def test_closed_loop_prediction_switches_to_the_delay_when_it_outlasts_a_batch():
    from perf.studies.analysis import predicted_throughput

    fit = fit_latency({1: 2.0, 17: 6.0})  # T = 2 ms, Δt = 0.25 ms: T_batch(16) = 5.75 ms
    # 1 ms < 5.75 ms: back-to-back batches of the formed sizes.
    assert predicted_throughput(fit, "dyn1ms", 16, {8: 10}) == pytest.approx(fit.throughput(8))
    # 10 ms > 5.75 ms: one batch of all 16 per 10 + 5.75 ms.
    assert predicted_throughput(fit, "dyn10ms", 16, {16: 10}) == pytest.approx(1000 * 16 / 15.75)
