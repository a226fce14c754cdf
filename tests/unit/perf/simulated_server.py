"""A simulated server behind the tuner's ``Server`` interface: Triton's batcher with known service
times (the truth), plus seeded noise, answering ``prepare`` and ``measure`` as the real session does.

Every run replays the load's arrivals through ``perf.model.batcher.simulate`` with the truth's service
model for the configuration loaded, then disturbs it the way a shared host does: each run's latencies
scaled by a factor drawn around 1 (a neighbour's load), an exponential scheduling tail on every
request, and now and then a run the hypervisor took CPU from (a stolen share, and stalls of tens of
milliseconds on some requests). The server's statistics and the machine's busy cores come from what
the simulation formed, as the real server's and ``/proc/stat`` would.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from client.stats import BatchBucket, ModelStats
from exporters.schema.models import ModelSpec, Spec
from perf.measure.loads import Load, arrival_times
from perf.measure.measurement import Measurement
from perf.measure.noise import NoisePolicy
from perf.measure.records import Record
from perf.measure.server_view import ServerDelta
from perf.model.batcher import BatcherConfig, ServiceModel, simulate
from perf.model.cpu import CpuModel

# Two shared cores: what the client's and the server's CPU work per request and per execution costs here.
TWO_CORES = CpuModel(idle_cores=0.1, per_request_s=150e-6, per_execution_s=200e-6, cores=2, slice_s=0.0003)


@dataclasses.dataclass(frozen=True)
class KneeService(ServiceModel):
    """A service whose compute per sample jumps beyond ``knee`` samples (the batch outgrows a cache):
    what ``T + (N-1)·Δt`` fitted over all sizes does not describe, so a prediction from it is off for
    large batches and only a measurement tells."""

    knee: int = 8
    beyond_s: float = 0.0  # each sample beyond the knee adds this

    def compute_s(self, batch: int) -> float:
        return super().compute_s(batch) + max(0, batch - self.knee) * self.beyond_s


@dataclasses.dataclass
class Noise:
    """What the simulated host adds to every run (all seeded)."""

    run_factor: float = 0.08  # each run's latencies × U(1 - f, 1 + f)
    tail_ms: float = 0.3  # each request + an exponential of this mean (scheduling)
    stolen_runs: float = 0.15  # the share of runs the hypervisor took CPU from
    stolen_share: float = 0.04  # ... this share of the CPUs' time
    stall_ms: float = 40.0  # ... stalling this share of their requests this long
    stalled: float = 0.02


class SimulatedServer:
    """``prepare``/``measure`` on the batcher simulation; ``runs``: every run measured, in order."""

    def __init__(
        self,
        truth: dict[int, ServiceModel],
        noise: Noise | None = None,
        seed: int = 0,
        seconds: float = 3.0,
        cores: int = 2,
        policy: NoisePolicy | None = None,
    ) -> None:
        self.truth = truth
        self.noise = noise or Noise()
        self.rng = np.random.default_rng(seed)
        self.seconds = seconds
        self.cores = cores
        self.policy = policy or NoisePolicy()
        self.current: BatcherConfig | None = None
        self.runs: list[Measurement] = []
        self.base: ModelSpec | None = None  # the spec's model, as ``make tune`` hands it to a session

    def __enter__(self) -> SimulatedServer:  # a session's context: nothing starts or stops
        return self

    def __exit__(self, *exc_info: object) -> None:
        pass

    def as_session(self) -> Callable[..., SimulatedServer]:
        """``TuneSetup.session``: ``make tune`` gets this server in place of the real one, for the
        model of the spec it asks a session for."""

        def session(spec: Spec, model: str, *args: object, **kwargs: object) -> SimulatedServer:
            self.base = spec.model(model)
            return self

        return session

    def prepare(self, config: BatcherConfig) -> None:
        self.current = config

    def measure(self, load: Load, label: str) -> Measurement:
        return self.policy.measure(lambda: self._run(load, label))

    def _run(self, load: Load, label: str) -> Measurement:
        assert self.current is not None, "measure before prepare"
        config, service = self.current, self.truth[self.current.instances]
        arrivals = arrival_times(load, self.seconds)
        result = simulate(arrivals, config, service, seed=int(self.rng.integers(1 << 30)))
        noise = self.noise
        latencies = result.latencies_s * self.rng.uniform(1 - noise.run_factor, 1 + noise.run_factor)
        latencies = latencies + self.rng.exponential(noise.tail_ms / 1e3, latencies.size)
        stolen = self.rng.random() < noise.stolen_runs
        if stolen:
            stalls = self.rng.random(latencies.size) < noise.stalled
            latencies = latencies + np.where(stalls, noise.stall_ms / 1e3, 0.0)
        records = [
            Record("simulated", float(a), float(a + lat), 1, 0, 0, True, "ok", (float(a),), label)
            for a, lat in zip(arrivals, latencies, strict=True)
        ]
        span = (0.05 * float(arrivals[-1]), float(arrivals[-1]) + 0.02)
        run = Measurement(label, "simulated", load, records, [span], (0, 1), True, len(records))
        run.server = self._server_view(
            arrivals, result, service, span[1], noise.stolen_share if stolen else 0.0
        )
        run.wall_s = span[1]
        self.runs.append(run)
        return run

    def _server_view(
        self, arrivals: np.ndarray, result, service: ServiceModel, seconds: float, stolen_share: float
    ) -> ServerDelta:
        """What Triton's statistics and ``/proc/stat`` would say of the simulated run."""
        sizes = result.batch_sizes.tolist()
        starts = result.starts_s
        batches: dict[int, BatchBucket] = {}
        queue_ns = compute_ns = request_ns = 0.0
        first = 0
        for size, start in zip(sizes, starts, strict=True):
            compute = service.exec_s(size)  # Triton's compute spans the whole execution on the instance
            bucket = batches.get(size, BatchBucket(0, 0))
            batches[size] = BatchBucket(bucket.executions + 1, bucket.compute_ns + int(compute * 1e9))
            waited = start - arrivals[first : first + size]
            queue_ns += float(waited.sum()) * 1e9
            compute_ns += size * compute * 1e9
            request_ns += float((waited + compute).sum()) * 1e9
            first += size
        stats = ModelStats(
            requests=len(arrivals),
            inferences=len(arrivals),
            executions=len(sizes),
            queue_ns=int(queue_ns),
            compute_ns=int(compute_ns),
            batches=batches,
            request_ns=int(request_ns),
        )
        cpu = service.cpu
        busy = cpu.utilization(len(arrivals) / seconds, len(sizes) / seconds) * cpu.cores if cpu else np.nan
        busy = float(busy * self.rng.uniform(0.95, 1.05))
        return ServerDelta(seconds, stats, 0.0, 0.0, busy_cores=busy, stolen_share=stolen_share)
