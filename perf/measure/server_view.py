"""The server's own view of a measurement, as differences between snapshots at the windows' edges: its
statistics, the CPU seconds of tritonserver and its stubs (a cost a busy client cannot distort), and the
machine's busy and stolen time."""

from __future__ import annotations

import json
import math
import os
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from client.stats import ModelStats, parse_model_stats
from exporters.devices import usable_cores
from server.proc_stat import stat_fields

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PROC_STAT = Path("/proc/stat")
IDLE_FIELDS = (3, 4)  # idle, iowait in the "cpu" line of /proc/stat
STEAL_FIELD = 7  # steal: the hypervisor kept a runnable CPU of this machine off the host's cores


@dataclass(frozen=True)
class HostCpu:
    """The machine's CPU counters since boot, every CPU summed (jiffies)."""

    busy: float  # running this machine's work (stolen time left out: it is not this machine's work)
    total: float  # everything, stolen time included
    stolen: float  # the hypervisor ran other guests while this one had work

    @classmethod
    def now(cls) -> HostCpu | None:
        """The counters, or None where ``/proc/stat`` is not there (then no CPU figures)."""
        try:
            line = PROC_STAT.read_text().splitlines()[0]
        except OSError:
            return None
        values = [float(v) for v in line.split()[1:9]]  # user..steal; guest is already in user
        idle = sum(values[i] for i in IDLE_FIELDS)
        stolen = values[STEAL_FIELD]
        return cls(sum(values) - idle - stolen, sum(values), stolen)

    def since(self, before: HostCpu | None) -> tuple[float, float]:
        """(cores busy on average, 0..usable cores; the share of the CPUs' time the hypervisor took, 0..1)
        since ``before``; NaN without a reading."""
        total = self.total - before.total if before else 0.0
        if total <= 0:
            return math.nan, math.nan
        host_cores = os.cpu_count() or 1  # /proc/stat's "cpu" line sums every CPU of the host
        busy = min((self.busy - before.busy) / total * host_cores, float(usable_cores()))
        return busy, (self.stolen - before.stolen) / total


def process_tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and its direct children (the backend stubs)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = stat_fields(stat)
        if fields is not None and (stat.parent.name == str(pid) or fields[1] == str(pid)):
            total += int(fields[11]) + int(fields[12])
    return total / CLOCK_TICKS


@dataclass(frozen=True)
class ServerSnapshot:
    at_s: float
    stats: ModelStats
    server_cpu_s: float
    client_cpu_s: float
    related: dict[str, ModelStats] = field(default_factory=dict)  # e.g. an ensemble's stage models
    host: HostCpu | None = None


class ServerEndpoints(Protocol):
    """Where to read the server's view (a running ``server.TritonServer``): HTTP ``host:port``, pid."""

    http_url: str
    pid: int | None


def _model_stats(endpoints: ServerEndpoints, model: str) -> ModelStats:
    url = f"http://{endpoints.http_url}/v2/models/{model}/stats"
    with urllib.request.urlopen(url, timeout=5) as response:
        return parse_model_stats(json.loads(response.read()))


def snapshot(
    endpoints: ServerEndpoints, model: str, at_s: float, related: tuple[str, ...] = ()
) -> ServerSnapshot:
    """Stats and CPU now, and the stats of the ``related`` models (an ensemble's steps)."""
    stats = _model_stats(endpoints, model)
    server_cpu = process_tree_cpu_s(endpoints.pid) if endpoints.pid else 0.0
    others = {name: _model_stats(endpoints, name) for name in related}
    return ServerSnapshot(at_s, stats, server_cpu, time.process_time(), others, HostCpu.now())


@dataclass(frozen=True)
class ServerDelta:
    """What the server did between two snapshots."""

    seconds: float
    stats: ModelStats
    server_cpu_s: float
    client_cpu_s: float
    related: dict[str, ModelStats] = field(default_factory=dict)  # each related model's difference
    busy_cores: float = math.nan  # the whole machine's cores busy on average (``busy_cores``)
    stolen_share: float = math.nan  # of the CPUs' time, what the hypervisor took (``stolen_share``)

    @property
    def server_cpu_s_per_1000(self) -> float:
        return 1000 * self.server_cpu_s / self.stats.inferences if self.stats.inferences else 0.0

    def cpu_ms_per_request(self) -> tuple[float, float]:
        """(server, everything else: mostly the client) CPU ms per request the server counted."""
        if not self.stats.requests:
            return math.nan, math.nan
        per_request = 1e3 / self.stats.requests
        machine_s = self.busy_cores * self.seconds
        return self.server_cpu_s * per_request, (machine_s - self.server_cpu_s) * per_request

    def cpu_load(self) -> tuple[float, float, float]:
        """(requests/s, executions/s, busy cores) over the span: what ``perf.model.cpu`` is fitted to."""
        if self.seconds <= 0:
            return 0.0, 0.0, math.nan
        return self.stats.requests / self.seconds, self.stats.executions / self.seconds, self.busy_cores


def delta(snapshots: list[ServerSnapshot]) -> ServerDelta:
    first, last = snapshots[0], snapshots[-1]
    busy, stolen = last.host.since(first.host) if last.host else (math.nan, math.nan)
    related = {name: last.related[name] - first.related[name] for name in last.related}
    return ServerDelta(
        last.at_s - first.at_s, last.stats - first.stats, last.server_cpu_s - first.server_cpu_s,
        last.client_cpu_s - first.client_cpu_s, related, busy, stolen,
    )  # fmt: skip
