"""A discrete-event simulation of Triton's dynamic batcher, the tuner's predictor.

The rules it follows (Triton's ``DynamicBatchScheduler`` as documented):

* a batch is formed only when a model instance is free (the batcher waits for a free slot), so requests
  that arrive while every instance runs wait for the next batch;
* with an instance free, the batch leaves at once when the pending requests reach a preferred batch
  size (``max_batch_size`` counts as one), taking the largest preferred size they reach; otherwise it
  leaves when the oldest pending request has waited ``max_queue_delay``, with everything pending
  (at most ``max_batch_size``);
* instances take batches as they free up (earliest free first), and run a batch of ``N`` for
  ``exec_s(N)``, the service model (``T + (N-1)·Δt`` plus a per-request cost, from measurement);
* a request's latency is its wait, its batch's execution and a fixed per-request overhead outside the
  batcher (client, network, frontend), also measured;
* with a CPU model (``perf.model.cpu``), each request also waits for a CPU as in an M/M/c queue (c
  cores) at the utilization the simulated requests and executions put on them: what a machine whose
  server and clients share a few cores adds to the tail.

No batching (``mode: none``) is ``max_batch_size`` 1.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from perf.errors import OptionError, check_at_least
from perf.model.cpu import CpuModel


@dataclass(frozen=True)
class BatcherConfig:
    """One candidate: what a model's ``dynamic_batching`` and ``instance_group`` would say."""

    max_batch_size: int
    max_queue_delay_us: int = 0
    preferred_batch_sizes: tuple[int, ...] = ()
    instances: int = 1

    def __post_init__(self) -> None:
        check_at_least((
            ("max_batch_size", self.max_batch_size, 1), ("max_queue_delay_us", self.max_queue_delay_us, 0),
            ("instances", self.instances, 1),
        ))  # fmt: skip
        bad = [s for s in self.preferred_batch_sizes if not 1 <= s <= self.max_batch_size]
        if bad:
            raise OptionError(
                f"preferred_batch_sizes {bad} outside 1..max_batch_size ({self.max_batch_size})"
            )

    @property
    def batching(self) -> bool:
        return self.max_batch_size > 1

    @property
    def targets(self) -> tuple[int, ...]:
        """Sizes that send a batch at once: the preferred sizes and ``max_batch_size``."""
        return tuple(sorted({*self.preferred_batch_sizes, self.max_batch_size}))

    @property
    def label(self) -> str:
        if not self.batching:
            return f"no batching ×{self.instances}"
        preferred = (
            f" pref {','.join(map(str, self.preferred_batch_sizes))}" if self.preferred_batch_sizes else ""
        )
        return (
            f"max {self.max_batch_size}, {self.max_queue_delay_us / 1000:g} ms{preferred} ×{self.instances}"
        )


@dataclass(frozen=True)
class ServiceModel:
    """How long an instance is busy with a batch of ``N``:
    ``t_s + (N-1)·dt_s + per_batch_s + N·per_request_s``.

    ``T`` and ``Δt`` are the compute the server reports; ``per_batch_s`` and ``per_request_s`` are what
    each execution and each request cost beyond it while the machine is saturated (the Python backend's
    IPC per execution; frontend work per request and, on a shared CPU, the client's own cycles),
    calibrated so the simulated capacity equals the measured one with and without batching
    (``perf.model.latency``). ``overhead_s`` is added to every request's latency outside the batcher
    and the instance (client, network, frontend). ``cpu`` adds the wait for a CPU, which grows with the
    load (``perf.model.cpu``).
    """

    t_s: float
    dt_s: float
    per_request_s: float = 0.0
    overhead_s: float = 0.0
    per_batch_s: float = 0.0
    cpu: CpuModel | None = None

    def compute_s(self, batch: int) -> float:
        """The compute of a batch of ``batch`` as the server's statistics count it: ``T + (N-1)·Δt``."""
        return self.t_s + (batch - 1) * self.dt_s

    def exec_s(self, batch: int) -> float:
        """How long an instance is busy with the batch: its compute and the costs beyond it."""
        return self.compute_s(batch) + self.per_batch_s + batch * self.per_request_s


@dataclass(frozen=True)
class SimResult:
    latencies_s: np.ndarray  # per request, in arrival order
    batch_sizes: np.ndarray  # per formed batch, in dispatch order
    span_s: float  # first arrival to last completion
    cpu_utilization: float = 0.0  # what the CPU model puts on the cores (0 without one)
    starts_s: np.ndarray = field(default_factory=lambda: np.empty(0))  # per batch: when it left the queue

    def p99_ms(self, skip: float = 0.05) -> float:
        """p99 over requests after the first ``skip`` fraction (the empty-system start is not steady)."""
        start = int(len(self.latencies_s) * skip)
        return float(np.percentile(self.latencies_s[start:], 99) * 1e3) if len(self.latencies_s) else 0.0

    @property
    def throughput(self) -> float:
        return len(self.latencies_s) / self.span_s if self.span_s > 0 else 0.0

    @property
    def mean_batch(self) -> float:
        return float(np.mean(self.batch_sizes)) if len(self.batch_sizes) else 0.0


def simulate(
    arrivals_s: Sequence[float], config: BatcherConfig, service: ServiceModel, seed: int = 0
) -> SimResult:
    """Run ``arrivals_s`` (sorted seconds) through the batcher of ``config``; see the module rules.
    ``seed`` draws the CPU waits when the service model has a CPU term."""
    arrivals = np.asarray(arrivals_s, dtype=float)
    if len(arrivals) and np.any(np.diff(arrivals) < 0):
        raise OptionError("arrivals must be sorted")
    times = arrivals.tolist()
    count = len(times)
    done = np.empty(count)
    sizes: list[int] = []
    starts: list[float] = []
    free = [0.0] * config.instances
    delay = config.max_queue_delay_us * 1e-6
    targets = config.targets
    smallest = targets[0]
    oldest = 0
    while oldest < count:
        ready = heapq.heappop(free)
        now = max(ready, times[oldest])
        expiry = times[oldest] + delay
        while True:
            pending = min(bisect.bisect_right(times, now, lo=oldest) - oldest, config.max_batch_size)
            if not config.batching:
                size = 1
                break
            if pending >= smallest:
                size = targets[bisect.bisect_right(targets, pending) - 1]
                break
            if now >= expiry:
                size = pending
                break
            upcoming = times[oldest + pending] if oldest + pending < count else float("inf")
            now = min(upcoming, expiry)
        finish = now + service.exec_s(size)
        done[oldest : oldest + size] = finish
        sizes.append(size)
        starts.append(now)
        heapq.heappush(free, finish)
        oldest += size
    latencies = done - arrivals + service.overhead_s
    span = float(done.max() - arrivals[0]) if count else 0.0
    utilization = 0.0
    if service.cpu is not None and span > 0:
        utilization = service.cpu.utilization(count / span, len(sizes) / span)
        latencies = latencies + service.cpu.waits_s(utilization, count, seed)
    return SimResult(latencies, np.asarray(sizes, dtype=int), span, utilization, np.asarray(starts))
