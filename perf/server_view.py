"""The server's own view of a measurement: statistics, metrics and CPU, as differences between two
snapshots taken at the edges of the measured windows.

* ``/v2/models/<m>/stats``: time in queue vs compute, and ``batch_stats``, i.e. executions and compute
  time per batch size, which says which batches the batcher really formed.
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

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
METRIC_LINE = re.compile(r"^(\w+)\{([^}]*)\}\s+([0-9.eE+-]+)$")


@dataclass(frozen=True)
class BatchBucket:
    """Executions of one batch size and their total compute (input + infer + output) in ns."""

    executions: int
    compute_ns: int


@dataclass(frozen=True)
class ModelStats:
    """Cumulative counters of one model, as ``/v2/models/<m>/stats`` reports them."""

    requests: int = 0  # successful requests
    failed: int = 0
    inferences: int = 0  # samples
    executions: int = 0  # model executions (formed batches)
    queue_ns: int = 0
    compute_ns: int = 0
    batches: dict[int, BatchBucket] = field(default_factory=dict)

    def __add__(self, other: ModelStats) -> ModelStats:
        return self._merge(other, 1)

    def __sub__(self, other: ModelStats) -> ModelStats:
        return self._merge(other, -1)

    def _merge(self, other: ModelStats, sign: int) -> ModelStats:
        empty = BatchBucket(0, 0)
        batches = {}
        for size in set(self.batches) | set(other.batches):
            mine, theirs = self.batches.get(size, empty), other.batches.get(size, empty)
            bucket = BatchBucket(
                mine.executions + sign * theirs.executions, mine.compute_ns + sign * theirs.compute_ns
            )
            if bucket.executions > 0:
                batches[size] = bucket
        return ModelStats(
            self.requests + sign * other.requests, self.failed + sign * other.failed,
            self.inferences + sign * other.inferences, self.executions + sign * other.executions,
            self.queue_ns + sign * other.queue_ns, self.compute_ns + sign * other.compute_ns, batches,
        )  # fmt: skip

    @property
    def mean_batch(self) -> float:
        return self.inferences / self.executions if self.executions else 0.0

    @property
    def queue_ms_per_request(self) -> float:
        return self.queue_ns / self.requests / 1e6 if self.requests else 0.0

    @property
    def compute_ms_per_request(self) -> float:
        return self.compute_ns / self.requests / 1e6 if self.requests else 0.0

    def compute_ms_at(self, size: int) -> float:
        bucket = self.batches.get(size)
        return bucket.compute_ns / bucket.executions / 1e6 if bucket and bucket.executions else 0.0


def _count_ns(stats: dict, key: str) -> tuple[int, int]:
    entry = stats.get(key, {})
    return int(entry.get("count", 0)), int(entry.get("ns", 0))


def parse_model_stats(payload: dict) -> ModelStats:
    """``ModelStats`` from the JSON of ``/v2/models/<m>/stats`` (all versions summed)."""
    total = ModelStats()
    for model in payload.get("model_stats", []):
        inference = model.get("inference_stats", {})
        batches: dict[int, BatchBucket] = {}
        for entry in model.get("batch_stats", []):
            executions, infer_ns = _count_ns(entry, "compute_infer")
            compute_ns = (
                infer_ns + _count_ns(entry, "compute_input")[1] + _count_ns(entry, "compute_output")[1]
            )
            batches[int(entry["batch_size"])] = BatchBucket(executions, compute_ns)
        compute_ns = sum(
            _count_ns(inference, k)[1] for k in ("compute_input", "compute_infer", "compute_output")
        )
        stats = ModelStats(
            requests=_count_ns(inference, "success")[0], failed=_count_ns(inference, "fail")[0],
            inferences=int(model.get("inference_count", 0)), executions=int(model.get("execution_count", 0)),
            queue_ns=_count_ns(inference, "queue")[1], compute_ns=compute_ns, batches=batches,
        )  # fmt: skip
        total = total + stats  # all versions together
    return total


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


@dataclass(frozen=True)
class ServerEndpoints:
    """Where to read the server's view: HTTP ``host:port``, metrics URL, and the server's pid."""

    http_url: str
    metrics_url: str | None = None
    pid: int | None = None


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read()


def snapshot(endpoints: ServerEndpoints, model: str, at_s: float) -> ServerSnapshot:
    """Read stats, metrics and CPU now. Blocking and quick (a few ms); called between windows."""
    stats = parse_model_stats(json.loads(_get(f"http://{endpoints.http_url}/v2/models/{model}/stats")))
    metrics = parse_metrics(_get(endpoints.metrics_url).decode(), model) if endpoints.metrics_url else {}
    server_cpu = process_tree_cpu_s(endpoints.pid) if endpoints.pid else 0.0
    return ServerSnapshot(at_s, stats, metrics, server_cpu, time.process_time())


@dataclass(frozen=True)
class ServerDelta:
    """What the server did between two snapshots."""

    seconds: float
    stats: ModelStats
    queue_us_metric: float  # nv_inference_queue_duration_us accumulated over the span
    pending_mean: float  # nv_inference_pending_request_count, mean of the samples taken
    server_cpu_s: float
    client_cpu_s: float

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
    )
