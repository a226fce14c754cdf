"""The server's own view of a measurement: statistics, metrics and CPU, as differences between two
snapshots taken at the edges of the measured windows.

* ``/v2/models/<m>/stats`` (parsed by ``client.stats``): time in queue vs compute, and ``batch_stats``,
  i.e. executions and compute time per batch size, which says which batches the batcher really formed.
* the metrics endpoint: pending requests (a gauge, sampled) and cumulative queue duration.
* ``/proc``: CPU seconds of tritonserver plus its Python-backend stub processes, so that server cost
  per 1,000 inferences can be compared with raw onnxruntime's, a figure a busy client cannot distort.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from client.stats import ModelStats, parse_model_stats

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
METRIC_LINE = re.compile(r"^(\w+)\{([^}]*)\}\s+([0-9.eE+-]+)$")


def parse_metrics(text: str, model: str) -> dict[str, float]:
    """``nv_*`` metric values of ``model`` (summed over versions) from Prometheus text."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        match = METRIC_LINE.match(line.strip())
        if match and f'model="{model}"' in match.group(2):
            values[match.group(1)] = values.get(match.group(1), 0.0) + float(match.group(3))
    return values


def process_tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and its direct children (the backend stubs)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        # fields[1] is ppid; [11], [12] are utime, stime (stat fields 14, 15)
        if stat.parent.name == str(pid) or fields[1] == str(pid):
            total += int(fields[11]) + int(fields[12])
    return total / CLOCK_TICKS


@dataclass(frozen=True)
class ServerSnapshot:
    at_s: float
    stats: ModelStats
    metrics: dict[str, float]
    server_cpu_s: float
    client_cpu_s: float
    related: dict[str, ModelStats] = field(default_factory=dict)  # e.g. an ensemble's stage models


@dataclass(frozen=True)
class ServerEndpoints:
    """Where to read the server's view: HTTP ``host:port``, metrics URL, and the server's pid."""

    http_url: str
    metrics_url: str | None = None
    pid: int | None = None

    @classmethod
    def of(cls, server: Any) -> ServerEndpoints:
        """A running ``server.TritonServer``'s endpoints."""
        return cls(server.http_url, server.metrics_url, server.pid)


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read()


def _model_stats(endpoints: ServerEndpoints, model: str) -> ModelStats:
    return parse_model_stats(json.loads(_get(f"http://{endpoints.http_url}/v2/models/{model}/stats")))


def snapshot(
    endpoints: ServerEndpoints, model: str, at_s: float, related: tuple[str, ...] = ()
) -> ServerSnapshot:
    """Read stats, metrics and CPU now, and the stats of the ``related`` models (an ensemble's steps).
    Blocking and quick (a few ms per model); called between windows."""
    stats = _model_stats(endpoints, model)
    metrics = parse_metrics(_get(endpoints.metrics_url).decode(), model) if endpoints.metrics_url else {}
    server_cpu = process_tree_cpu_s(endpoints.pid) if endpoints.pid else 0.0
    others = {name: _model_stats(endpoints, name) for name in related}
    return ServerSnapshot(at_s, stats, metrics, server_cpu, time.process_time(), others)


@dataclass(frozen=True)
class ServerDelta:
    """What the server did between two snapshots."""

    seconds: float
    stats: ModelStats
    queue_us_metric: float  # nv_inference_queue_duration_us accumulated over the span
    pending_mean: float  # nv_inference_pending_request_count, mean of the samples taken
    server_cpu_s: float
    client_cpu_s: float
    related: dict[str, ModelStats] = field(default_factory=dict)  # each related model's difference

    @property
    def server_cpu_s_per_1000(self) -> float:
        return 1000 * self.server_cpu_s / self.stats.inferences if self.stats.inferences else 0.0


def delta(snapshots: list[ServerSnapshot]) -> ServerDelta:
    first, last = snapshots[0], snapshots[-1]
    pending = [s.metrics.get("nv_inference_pending_request_count", 0.0) for s in snapshots[1:]]
    return ServerDelta(
        seconds=last.at_s - first.at_s,
        stats=last.stats - first.stats,
        queue_us_metric=last.metrics.get("nv_inference_queue_duration_us", 0.0)
        - first.metrics.get("nv_inference_queue_duration_us", 0.0),
        pending_mean=sum(pending) / len(pending) if pending else 0.0,
        server_cpu_s=last.server_cpu_s - first.server_cpu_s,
        client_cpu_s=last.client_cpu_s - first.client_cpu_s,
        related={name: last.related[name] - first.related[name] for name in last.related},
    )
