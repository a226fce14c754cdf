"""A scripted server: the simulated server (``simulated_server``: Triton's batcher with known service
times, whose statistics the probe fits) with every run's verdict scripted, so that a test asserts what
a tool must do with the runs it got, whatever timing a host would give.

A run of a configuration at or below its ``capacity`` meets the budget (every latency a third of it);
above, it misses by far: the server answers only ``capacity`` requests a second (the rest fail) at a
p99 of ``OVER`` × the budget. ``noisy``: points whose next runs miss by a little instead (a neighbour's
stall), each entry used up by one run; ``always_missing``: points every run of which misses by a little.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from perf.measure.loads import Load
from perf.measure.measurement import Measurement
from perf.model.batcher import BatcherConfig, ServiceModel
from tests.unit.perf.simulated_server import Noise, SimulatedServer

OVER = 4.5  # × the budget: a p99 that misses by far (``perf.session.search.FAR_MISS`` is 4)
NEAR = 1.02  # × the budget: a miss by a little
QUIET = Noise(run_factor=0.0, tail_ms=1e-6, stolen_runs=0.0)


class ScriptedServer(SimulatedServer):
    """``prepare``/``measure`` with scripted verdicts (module docstring); ``made``: (config, rate,
    label) of every run, in order."""

    def __init__(
        self, truth: dict[int, ServiceModel], budget_ms: float, capacity: Callable[[BatcherConfig], float],
        seed: int = 0, noise: Noise = QUIET, **kwargs,
    ) -> None:  # fmt: skip
        super().__init__(truth, noise, seed=seed, **kwargs)
        self.budget_ms, self.capacity = budget_ms, capacity
        self.noisy: list[tuple[BatcherConfig, float]] = []
        self.always_missing: set[tuple[BatcherConfig, float]] = set()
        self.made: list[tuple[BatcherConfig, float, str]] = []

    def _run(self, load: Load, label: str) -> Measurement:
        run = super()._run(load, label)
        config = self.current
        assert config is not None
        self.made.append((config, load.rate, label))
        point = (config, load.rate)
        if point in self.noisy or point in self.always_missing:
            if point in self.noisy:
                self.noisy.remove(point)
            latency, capacity = NEAR * self.budget_ms / 1e3, float("inf")
        elif load.rate <= self.capacity(config):
            latency, capacity = self.budget_ms / 3e3, float("inf")
        else:
            latency, capacity = OVER * self.budget_ms / 1e3, self.capacity(config)
        answered = capacity / load.rate if load.rate > capacity else 1.0
        records = []
        for index, record in enumerate(run.records):
            ok = int((index + 1) * answered) > int(index * answered)  # evenly spread
            records.append(
                dataclasses.replace(
                    record, recv_s=record.send_s + latency, ok=ok, status="ok" if ok else "overloaded"
                )
            )
        run = self.runs[-1] = dataclasses.replace(run, records=records)
        return run
