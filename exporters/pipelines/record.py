"""``pipeline.json``: what a pipeline build did, as one typed record read back by a rebuild, the build's
summary and the perf pipeline study (fields, not keys; the JSON shape defined here alone)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from exporters.pipelines.splitter import SplitPlan
from exporters.schema.typed import parse


@dataclass(frozen=True)
class StageRecord:
    name: str
    runtime: str  # "onnx" | "torch_export"
    artifact: str  # file name inside <name>/1/
    blocks: tuple[int, int] | None  # [start, stop) of the model's blocks; None for a named split
    inputs: tuple[str, ...]
    output: str
    sha256: str = ""  # of the artifact as written; a cached build requires the file to still match


@dataclass(frozen=True)
class BoundaryRecord:
    """A tensor that crosses a stage boundary, and its bytes per request row as sent and in fp32."""

    tensor: str
    dtype: str
    shape: tuple[int, ...]
    bytes_per_row: int
    fp32_bytes_per_row: int


@dataclass(frozen=True)
class PipelineRecord:
    content_hash: str  # of the model, its weights and the pipeline spec: equal hash, nothing to redo
    pipeline: str
    model: str
    split: str
    stages: tuple[StageRecord, ...]
    split_plan: SplitPlan | None  # the measured cuts (None for embedding_dense)
    boundary_dtype: str
    boundaries: tuple[BoundaryRecord, ...]
    split_max_rel_error: float  # the stages in sequence vs the whole model, uncompressed (torch)
    compression_max_rel_error: float  # compressed vs uncompressed boundaries (0 for fp32)
    artifact_max_rel_error: float  # the exported artifacts, loaded as the server loads them
    build_id: str = ""  # names the boundary tensors: stages of two builds cannot be chained

    @property
    def boundary_bytes_per_request(self) -> int:
        return sum(b.bytes_per_row for b in self.boundaries)

    @property
    def boundary_bytes_saved_per_request(self) -> int:
        return sum(b.fp32_bytes_per_row for b in self.boundaries) - self.boundary_bytes_per_request

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["boundary_bytes_per_request"] = self.boundary_bytes_per_request  # for readers of the file
        data["boundary_bytes_saved_per_request"] = self.boundary_bytes_saved_per_request
        return json.loads(json.dumps(data))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PipelineRecord:
        """The record ``to_json`` wrote; a missing or unknown key raises ``SpecError``, a ``ValueError``."""
        derived = {"boundary_bytes_per_request", "boundary_bytes_saved_per_request"}
        return parse(cls, {k: v for k, v in data.items() if k not in derived}, "pipeline.json")
