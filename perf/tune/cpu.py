"""How busy the machine's CPUs are, measured and modelled: the tuner's contention term.

On a machine where the server, its frontend threads and the load generator share a few cores, a
request's latency includes time spent waiting for a CPU, and that wait grows as the cores fill up. The
batcher simulation alone (execution times from the probe's closed loops) leaves it out and, measured on
two cores, predicted half the p99 the server showed at 60% of its capacity. So the tuner

* measures the CPU time the whole machine spent during the probe's open-loop calibration runs
  (``/proc/stat``: all processes, the client's included, which is what a request competes with);
* fits it to what each run did: ``cores busy = idle + a·requests/s + b·executions/s`` (``CpuModel``), so a
  candidate's utilization at any rate follows from the requests and executions the simulation forms;
* adds to each simulated request the wait of an M/M/c queue for one of the ``c`` cores at that
  utilization ``ρ`` with a service time ``s`` (the scheduling slice): with the Erlang C probability a
  wait drawn from an exponential of mean ``s/(c(1-ρ))``, else none. ``s`` is calibrated from the
  probe's open-loop runs (measured p99 vs simulated). One parameter, a textbook shape, both measured
  on the machine it predicts.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)
PROC_STAT = Path("/proc/stat")
MAX_UTILIZATION = 0.97  # beyond it the M/M/c wait diverges; the simulation's own queue takes over
IDLE_FIELDS = (3, 4)  # idle, iowait in the "cpu" line of /proc/stat
STEAL_FIELD = 7  # steal: the hypervisor kept a runnable CPU of this machine off the host's cores


def usable_cores() -> int:
    """The cores this process may run on (the container's share, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass(frozen=True)
class CpuTimes:
    busy: float  # jiffies the CPUs spent running this machine's work, since boot
    total: float  # all jiffies, since boot (stolen ones included)
    stolen: float = 0.0  # jiffies the hypervisor ran other guests while this one had work (steal)

    @classmethod
    def now(cls) -> CpuTimes | None:
        """The machine's CPU counters, or None where ``/proc/stat`` is not there (then no CPU figures).
        Stolen time is not this machine's work: the CPU model's busy cores leave it out."""
        try:
            line = PROC_STAT.read_text().splitlines()[0]
        except OSError:
            return None
        values = [float(v) for v in line.split()[1:9]]  # user..steal; guest is already in user
        idle = sum(values[i] for i in IDLE_FIELDS)
        stolen = values[STEAL_FIELD]
        return cls(sum(values) - idle - stolen, sum(values), stolen)


def stolen_share(before: CpuTimes | None, after: CpuTimes | None) -> float:
    """The share of the CPUs' time the hypervisor took between two readings (0..1); NaN without
    readings."""
    if before is None or after is None or after.total <= before.total:
        return float("nan")
    return (after.stolen - before.stolen) / (after.total - before.total)


def busy_cores(before: CpuTimes | None, after: CpuTimes | None, cores: int | None = None) -> float:
    """Cores busy on average between two readings (0..cores); NaN without readings."""
    if before is None or after is None or after.total <= before.total:
        return float("nan")
    host_cores = os.cpu_count() or 1  # /proc/stat's "cpu" line sums every CPU of the host
    fraction = (after.busy - before.busy) / (after.total - before.total)
    return min(fraction * host_cores, float(cores or host_cores))


@dataclass(frozen=True)
class CpuModel:
    """``cores busy = idle + per_request·requests/s + per_execution·executions/s`` on ``cores`` cores,
    and ``slice_s``, the M/M/c service time of the CPU wait (see the module docstring)."""

    idle_cores: float
    per_request_s: float  # CPU seconds a request costs the machine (client, frontend, backend)
    per_execution_s: float  # CPU seconds an execution costs beyond its requests
    cores: int
    slice_s: float = 0.0
    # the share of the CPUs' time the hypervisor took (steal): 0 for a prediction; a calibration run it
    # took CPU from is simulated on the cores it left, so that its p99 does not all go into the slice
    stolen_share: float = 0.0

    def utilization(self, requests_per_s: float, executions_per_s: float) -> float:
        busy = self.idle_cores + self.per_request_s * requests_per_s + self.per_execution_s * executions_per_s
        left = self.cores * (1.0 - self.stolen_share)
        return float(min(MAX_UTILIZATION, max(0.0, busy / left)))

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
    """Least squares over the probe's runs, every coefficient kept >= 0 (a negative CPU cost is noise:
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
    log.info("CPU model: %s on %d cores from %d runs", coefficients, cores, len(busy))
    return CpuModel(float(coefficients[0]), float(coefficients[1]), float(coefficients[2]), cores)
