"""Predictions from the batcher simulation: p99 at a load, and the highest rate within a p99 budget. The
arrivals come from the load factories the engines replay, so a prediction and a measurement at one
rate see one seeded process."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from perf.measure.loads import Load, arrival_times, poisson
from perf.model.batcher import BatcherConfig, ServiceModel, SimResult, simulate

LoadAt = Callable[[float], Load]  # rate -> the load shape at that mean rate
ARRIVALS_MAX = 40_000  # a prediction simulates at most this many arrivals (its seconds, or fewer)


@dataclass(frozen=True)
class Prediction:
    config: BatcherConfig
    rate: float
    p99_ms: float
    throughput: float
    mean_batch: float
    sustained: bool  # the server kept up: throughput within 5% of the offered rate
    cpu_utilization: float = 0.0  # the cores' utilization the CPU model puts on the machine there

    def meets(self, budget_ms: float) -> bool:
        return self.sustained and self.p99_ms <= budget_ms


def prediction(
    config: BatcherConfig, rate: float, result: SimResult, arrivals_s: Sequence[float]
) -> Prediction:
    """``result``, the simulated run of ``arrivals_s``: sustained where it served 95% of the rate offered."""
    offered = len(arrivals_s) / arrivals_s[-1] if len(arrivals_s) > 1 else 0.0
    sustained = bool(result.throughput >= 0.95 * offered)
    figures = (result.p99_ms(), result.throughput, result.mean_batch, sustained, result.cpu_utilization)
    return Prediction(config, rate, *figures)


def predict(config: BatcherConfig, service: ServiceModel, load: Load, seconds: float = 8.0) -> Prediction:
    arrivals = arrival_times(load, seconds, ARRIVALS_MAX)
    return prediction(config, load.rate, simulate(arrivals, config, service), arrivals)


def capacity_bound(config: BatcherConfig, service: ServiceModel) -> float:
    """Requests per second with every instance running full batches back to back: no rate beyond."""
    size = config.max_batch_size
    return config.instances * size / service.exec_s(size)


def max_rate(
    config: BatcherConfig,
    service: ServiceModel,
    budget_ms: float,
    load_at: LoadAt = poisson,
    seconds: float = 6.0,
) -> Prediction | None:
    """The highest rate whose predicted p99 meets ``budget_ms``, or None if no rate does."""
    return highest_rate(
        lambda rate: predict(config, service, load_at(rate), seconds),
        capacity_bound(config, service),
        budget_ms,
    )


def highest_rate(
    predict_at: Callable[[float], Prediction], bound: float, budget_ms: float, scan: int = 8, steps: int = 7
) -> Prediction | None:
    """The highest rate within the budget for any predictor: ``scan`` rates up to ``bound``, then ``steps``
    halvings above the highest that met it (p99 is not monotonic in the rate under batching: at a trickle
    every request waits the whole delay, so a scan comes before the bisection)."""
    rates = [bound * (k + 1) / scan for k in range(scan)]
    results = [predict_at(rate) for rate in rates]
    passing = [k for k, found in enumerate(results) if found.meets(budget_ms)]
    if not passing:
        return None
    best = results[passing[-1]]
    low, high = rates[passing[-1]], rates[passing[-1] + 1] if passing[-1] + 1 < scan else bound
    for _ in range(steps):
        rate = (low + high) / 2
        found = predict_at(rate)
        if found.meets(budget_ms):
            best, low = found, rate
        else:
            high = rate
    return best
