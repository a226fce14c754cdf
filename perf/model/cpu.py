"""The wait for a CPU on a machine whose server and load generator share a few cores: without it the
batcher simulation predicted half the p99 the server showed at 60% of its capacity on two cores. The
busy cores are fitted to requests and executions per second (``CpuModel``), and each request waits as
in an M/M/c queue for a core at that utilization, with one calibrated parameter, the slice."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MAX_UTILIZATION = 0.97  # beyond it the M/M/c wait diverges; the simulation's own queue takes over


@dataclass(frozen=True)
class CpuModel:
    """``cores busy = idle + per_request·requests/s + per_execution·executions/s`` on ``cores`` cores, and
    ``slice_s``, the M/M/c service time of the CPU wait."""

    idle_cores: float
    per_request_s: float  # CPU seconds a request costs the machine (client, frontend, backend)
    per_execution_s: float  # CPU seconds an execution costs beyond its requests
    cores: int
    slice_s: float = 0.0

    def utilization(self, requests_per_s: float, executions_per_s: float) -> float:
        busy = self.idle_cores + self.per_request_s * requests_per_s + self.per_execution_s * executions_per_s
        return float(min(MAX_UTILIZATION, max(0.0, busy / self.cores)))

    def waits_s(self, utilization: float, count: int, seed: int = 0) -> np.ndarray:
        """``count`` M/M/c waits for one of the cores at ``utilization``: with the Erlang C probability
        an exponential of mean ``s/(c(1-ρ))``, else 0."""
        if self.slice_s <= 0 or utilization <= 0 or count == 0:
            return np.zeros(count)
        rng = np.random.default_rng(seed + 7919)
        waiting = rng.random(count) < erlang_c(self.cores, utilization)
        mean = self.slice_s / (self.cores * (1 - utilization))
        return np.where(waiting, rng.exponential(mean, count), 0.0)


def erlang_c(servers: int, utilization: float) -> float:
    """The probability that an arrival to an M/M/c queue at ``utilization`` (per server) waits."""
    offered = servers * utilization
    term = offered**servers / math.factorial(servers) / (1 - utilization)
    below = sum(offered**k / math.factorial(k) for k in range(servers))
    return term / (below + term)


def fit_cpu_model(
    requests_per_s: Sequence[float],
    executions_per_s: Sequence[float],
    cores_busy: Sequence[float],
    cores: int,
) -> CpuModel:
    """Least squares over measured runs, every coefficient kept >= 0 (a negative CPU cost is noise:
    the term is dropped and the rest refitted). Runs without a CPU reading (NaN) are left out."""
    rows = np.column_stack([np.ones(len(cores_busy)), requests_per_s, executions_per_s])
    busy = np.asarray(cores_busy, dtype=float)
    keep = np.isfinite(busy)
    rows, busy = rows[keep], busy[keep]
    active = [0, 1, 2]
    coefficients = np.zeros(3)
    while active and len(busy) >= len(active):
        solution, *_ = np.linalg.lstsq(rows[:, active], busy, rcond=None)
        if np.all(solution >= 0):
            coefficients[active] = solution
            break
        active.pop(int(np.argmin(solution)))
    return CpuModel(float(coefficients[0]), float(coefficients[1]), float(coefficients[2]), cores)
