"""Server statistics in one shape for both protocols: what the batcher formed and where time went.

gRPC's JSON renders int64 as strings; HTTP gives numbers. ``model_stats`` normalizes both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ModelStats:
    name: str
    version: str
    inference_count: int  # samples inferred (a batch of 8 counts 8)
    execution_count: int  # model executions (a formed batch counts 1)
    success_count: int
    fail_count: int
    queue_ns: int
    compute_ns: int  # input + infer + output, summed over requests (each request of a batch counts it)
    batches: dict[int, tuple[int, int]] = field(default_factory=dict)  # batch size -> (executions, infer ns)

    @property
    def mean_batch(self) -> float:
        return self.inference_count / self.execution_count if self.execution_count else 0.0

    @property
    def mean_queue_ms(self) -> float:
        return self.queue_ns / max(self.success_count, 1) / 1e6

    @property
    def mean_compute_ms(self) -> float:
        """Compute time a request saw (its batch's), averaged over requests."""
        return self.compute_ns / max(self.success_count, 1) / 1e6


def _duration(stats: dict[str, Any], key: str) -> tuple[int, int]:
    entry = stats.get(key, {})
    return int(entry.get("count", 0)), int(entry.get("ns", 0))


def model_stats(client: Any, protocol: str, model: str) -> list[ModelStats]:
    """Statistics of every loaded version of ``model``."""
    raw = (
        client.get_inference_statistics(model, as_json=True)
        if protocol == "grpc"
        else client.get_inference_statistics(model)
    )
    result = []
    for entry in raw.get("model_stats", []):
        inference = entry.get("inference_stats", {})
        batches = {int(b["batch_size"]): _duration(b, "compute_infer") for b in entry.get("batch_stats", [])}
        result.append(
            ModelStats(
                name=entry["name"],
                version=str(entry.get("version", "")),
                inference_count=int(entry.get("inference_count", 0)),
                execution_count=int(entry.get("execution_count", 0)),
                success_count=_duration(inference, "success")[0],
                fail_count=_duration(inference, "fail")[0],
                queue_ns=_duration(inference, "queue")[1],
                compute_ns=sum(
                    _duration(inference, k)[1] for k in ("compute_input", "compute_infer", "compute_output")
                ),
                batches=batches,
            )
        )
    return result
