"""Server statistics (``/v2/models/<m>/stats``) in one shape for both protocols (gRPC's JSON renders
int64 as strings), subtractable so perf can take the difference of two snapshots."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

COMPUTE_PARTS = ("compute_input", "compute_infer", "compute_output")


@dataclass(frozen=True)
class BatchBucket:
    """Executions of one batch size and their total compute (input + infer + output) in ns."""

    executions: int
    compute_ns: int


@dataclass(frozen=True)
class ModelStats:
    """Cumulative counters of one model (one version, or all versions summed)."""

    # What Triton counts, which is not what succeeded: on 2.51 a Python-backend model's error responses
    # count in ``requests`` (as successes), and an ensemble counts each failing request twice in
    # ``failed``. Succeeded/failed figures come from the client's records (tests/faults/test_statistics).
    requests: int = 0  # requests the server answered as "success" (incl. Python-backend errors)
    failed: int = 0
    inferences: int = 0  # samples (a request of batch 8 counts 8)
    executions: int = 0  # model executions (a formed batch counts 1)
    queue_ns: int = 0
    compute_ns: int = 0  # summed over requests: each request of a batch counts the batch's compute
    batches: dict[int, BatchBucket] = field(default_factory=dict)
    request_ns: int = 0  # successful requests' whole time in the server (an ensemble: end to end)

    def __add__(self, other: ModelStats) -> ModelStats:
        return self._merge(other, 1)

    def __sub__(self, other: ModelStats) -> ModelStats:
        return self._merge(other, -1)

    def _merge(self, other: ModelStats, sign: int) -> ModelStats:
        empty = BatchBucket(0, 0)
        batches = {}
        for size in self.batches.keys() | other.batches.keys():
            mine, theirs = self.batches.get(size, empty), other.batches.get(size, empty)
            if (executions := mine.executions + sign * theirs.executions) > 0:
                batches[size] = BatchBucket(executions, mine.compute_ns + sign * theirs.compute_ns)
        counters = (f.name for f in fields(self) if f.name != "batches")
        return ModelStats(
            **{name: getattr(self, name) + sign * getattr(other, name) for name in counters}, batches=batches
        )

    @property
    def mean_batch(self) -> float:
        return self.inferences / self.executions if self.executions else 0.0

    @property
    def queue_ms_per_request(self) -> float:
        return self.queue_ns / self.requests / 1e6 if self.requests else 0.0

    @property
    def compute_ms_per_request(self) -> float:
        return self.compute_ns / self.requests / 1e6 if self.requests else 0.0

    @property
    def request_ms_per_request(self) -> float:
        return self.request_ns / self.requests / 1e6 if self.requests else 0.0

    def compute_ms_at(self, size: int) -> float:
        bucket = self.batches.get(size)
        return bucket.compute_ns / bucket.executions / 1e6 if bucket and bucket.executions else 0.0


def _count_ns(stats: dict[str, Any], key: str) -> tuple[int, int]:
    entry = stats.get(key, {})
    return int(entry.get("count", 0)), int(entry.get("ns", 0))


def parse_version_stats(entry: dict[str, Any]) -> ModelStats:
    inference = entry.get("inference_stats", {})
    batches = {
        int(b["batch_size"]): BatchBucket(
            _count_ns(b, "compute_infer")[0], sum(_count_ns(b, k)[1] for k in COMPUTE_PARTS)
        )
        for b in entry.get("batch_stats", [])
    }
    return ModelStats(
        requests=_count_ns(inference, "success")[0],
        failed=_count_ns(inference, "fail")[0],
        inferences=int(entry.get("inference_count", 0)),
        executions=int(entry.get("execution_count", 0)),
        queue_ns=_count_ns(inference, "queue")[1],
        compute_ns=sum(_count_ns(inference, k)[1] for k in COMPUTE_PARTS),
        batches=batches,
        request_ns=_count_ns(inference, "success")[1],
    )


def parse_model_stats(payload: dict[str, Any]) -> ModelStats:
    """``ModelStats`` of a whole ``/v2/models/<m>/stats`` answer, all versions summed."""
    return sum((parse_version_stats(entry) for entry in payload.get("model_stats", [])), ModelStats())


def fetch_stats(client: Any, protocol: str, model: str = "") -> dict[str, Any]:
    """The raw statistics answer as a dict (every model when ``model`` is empty)."""
    if protocol == "grpc":
        return client.get_inference_statistics(model, as_json=True)
    return client.get_inference_statistics(model)


def model_stats(client: Any, protocol: str, model: str) -> ModelStats:
    return parse_model_stats(fetch_stats(client, protocol, model))


def without_warmup(
    stats: ModelStats, recorded: dict[str, Any] | None
) -> tuple[ModelStats, ModelStats | None]:
    """``stats`` less the recorded warm-up, and the warm-up; ``stats`` and None where nothing was
    recorded or the record is not this load's (a counter below it: the model was loaded again)."""
    if not recorded:
        return stats, None
    warmup = parse_version_stats(recorded)
    counters = ("requests", "inferences", "executions", "compute_ns", "queue_ns")
    if any(getattr(stats, key) < getattr(warmup, key) for key in counters):
        return stats, None
    return stats - warmup, warmup
