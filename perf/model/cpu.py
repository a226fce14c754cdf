"""The wait for a CPU: the tuner's contention term, for a machine whose server, frontend threads and
load generator share a few cores.

A request's latency there includes time spent waiting for a CPU, and that wait grows as the cores fill
up; the batcher simulation alone (execution times from the server's statistics) leaves it out and, on
two cores, predicted half the p99 the server showed at 60% of its capacity. So:

* the cores busy over a run are fitted to what it did: ``cores busy = idle + a·requests/s +
  b·executions/s`` (``CpuModel``), so a candidate's utilization at any rate follows from the requests
  and executions the simulation forms;
* each simulated request waits as in an M/M/c queue for one of the ``c`` cores at that utilization
  ``ρ``, with a service time ``s`` (the scheduling slice): with the Erlang C probability a wait drawn
  from an exponential of mean ``s/(c(1-ρ))``, else none. ``s`` is calibrated from measured runs
  (``perf.model.service.slice_for``). One parameter, a textbook shape.

The readings themselves (``/proc/stat``) are the measurement layer's (``perf.measure.server_view``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MAX_UTILIZATION = 0.97  # beyond it the M/M/c wait diverges; the simulation's own queue takes over


@dataclass(frozen=True)
class CpuModel:
    """``cores busy = idle + per_request·requests/s + per_execution·executions/s`` on ``cores`` cores,
    and ``slice_s``, the M/M/c service time of the CPU wait (see the module docstring)."""

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
