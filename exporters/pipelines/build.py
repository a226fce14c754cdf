"""Build the spec's pipelines into the repository: the stage chain is held to the whole model in torch
(uncompressed: the split must be exact), then its artifacts, loaded back as the server loads them,
before any file takes its final name. ``pipeline.json`` keeps the cuts and figures under a content
hash, so a rebuild skips the work and never moves a cut by timing noise."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import secrets
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

import python_backend
from exporters.artifacts.records import file_matches, file_sha256, read_record, write_record
from exporters.configs.model_config import ModelConfig, write_config
from exporters.errors import SpecError
from exporters.onnx_export import content_hash
from exporters.pipelines.configs import pipeline_configs
from exporters.pipelines.splitter import SplitPlan
from exporters.pipelines.stages import (
    Stage,
    Tensors,
    block_stages,
    check_stage_file,
    check_stages,
    embedding_dense_stages,
    load_stage,
    run_stages,
    stage_artifact,
    stage_examples,
)
from exporters.schema.models import ModelSpec, PipelineSpec, Spec
from exporters.schema.sections import TensorSpec
from exporters.schema.typed import parse
from exporters.sources.inputs import draw_inputs
from exporters.sources.load import build_torch_model
from python_backend.atomic_files import staged
from python_backend.dtypes import DTYPES

log = logging.getLogger(__name__)

BUILD_VERSION = "1"  # bump when the pipeline build changes, to invalidate recorded artifacts
BUILD_ID_BYTES = 4  # a fresh id per export names the boundary tensors (8 hex digits)
RECORD = "pipeline.json"
COST_BATCH = 8  # the batch the splitter times blocks at: a typical formed batch, not batch 1


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

    @classmethod
    def of(cls, tensor: TensorSpec) -> BoundaryRecord:
        elements = math.prod(tensor.shape)
        return cls(
            tensor.name, tensor.dtype, tensor.shape, elements * DTYPES[tensor.dtype].size, elements * 4
        )


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


@dataclass(frozen=True)
class BuiltPipeline:
    spec: PipelineSpec
    record: PipelineRecord
    configs: list[ModelConfig]  # the ensemble first, then the stages
    cached: bool


def _samples(spec: ModelSpec, model: nn.Module, batch: int, seed: int) -> Tensors:
    arrays = draw_inputs(spec, batch, seed, model)
    return {t.name: torch.from_numpy(a) for t, a in zip(spec.inputs, arrays, strict=True)}


def make_stages(
    pipeline: PipelineSpec, spec: ModelSpec, model: nn.Module, plan: SplitPlan | None = None,
    build_id: str = "",
) -> tuple[list[Stage], SplitPlan | None]:  # fmt: skip
    """The pipeline's stages in torch (cuts planned now unless ``plan`` is given), named by ``build_id``."""
    if pipeline.split == "embedding_dense":
        return embedding_dense_stages(pipeline, spec, model, build_id), None
    example = _samples(spec, model, min(COST_BATCH, spec.max_batch_size), seed=0)[spec.inputs[0].name]
    return block_stages(pipeline, spec, model, example, plan, build_id)


def _recorded(repository: Path, pipeline: PipelineSpec, digest: str) -> PipelineRecord | None:
    """The record of an identical earlier build whose artifacts are all still there, else None."""
    try:
        record = PipelineRecord.from_json(read_record(repository / pipeline.name / RECORD) or {})
    except (KeyError, TypeError, ValueError):  # none, an older or a damaged record: rebuild
        return None
    if record.content_hash != digest or not record.build_id:  # no id: an older build
        return None
    intact = all(file_matches(repository / s.name / "1" / s.artifact, s.sha256) for s in record.stages)
    return record if intact else None


def _export(
    pipeline: PipelineSpec, spec: ModelSpec, model: nn.Module, stages: list[Stage], plan: SplitPlan | None,
    repository: Path, digest: str, build_id: str,
) -> PipelineRecord:  # fmt: skip
    """Check in torch, export to temporary files, check the artifacts, then commit; the record."""
    batches = sorted({1, min(3, spec.max_batch_size)})  # the export's batch axis ends at max_batch_size
    samples = [_samples(spec, model, batch, seed=100 + batch) for batch in batches]

    def whole(tensors: Tensors) -> torch.Tensor:
        return model(*(tensors[t.name] for t in spec.inputs))

    fp32 = dataclasses.replace(pipeline, boundary_dtype="fp32")
    exact = make_stages(fp32, spec, model, plan, build_id)[0] if pipeline.boundary_dtype != "fp32" else stages
    split = check_stages(exact, whole, samples, "fp32", f"{pipeline.name} (stages in sequence)")
    compression = 0.0
    if pipeline.boundary_dtype != "fp32":

        def uncompressed(tensors: Tensors) -> torch.Tensor:
            return run_stages(exact, tensors)[exact[-1].output.name]

        what = f"{pipeline.name} ({pipeline.boundary_dtype} boundaries vs uncompressed pipeline)"
        compression = check_stages(stages, uncompressed, samples, pipeline.boundary_dtype, what).max_rel_error
    created: list[Path] = []  # folders this call made, parents first
    try:
        with contextlib.ExitStack() as commit:  # a clean exit replaces every stage's artifact whole
            partials = []
            for stage, example in zip(stages, stage_examples(stages, samples[-1]), strict=True):
                folder = repository / stage.name / "1"
                created += [path for path in (*reversed(folder.parents), folder) if not path.exists()]
                data = stage_artifact(stage, example, spec.max_batch_size)
                partials.append(commit.enter_context(staged(folder / stage.artifact_name, len(data))))
                partials[-1].write_bytes(data)
                check_stage_file(stage, partials[-1])
            loaded = [load_stage(stage, path) for stage, path in zip(stages, partials, strict=True)]
            what = f"{pipeline.name} (exported stages vs {spec.name})"
            artifacts = check_stages(stages, whole, samples, pipeline.boundary_dtype, what, fns=loaded)
            hashes = [file_sha256(partial) for partial in partials]
    except BaseException:  # nothing half-built stays in the repository, whatever the failure
        for folder in reversed(created):
            with contextlib.suppress(OSError):  # not empty: something else lives there now
                folder.rmdir()
        raise
    ranges = plan.stage_ranges() if plan else [None] * len(stages)
    return PipelineRecord(
        content_hash=digest, pipeline=pipeline.name, model=spec.name, split=pipeline.split,
        stages=tuple(
            StageRecord(
                s.name, s.runtime, s.artifact_name, r, tuple(t.name for t in s.inputs), s.output.name, sha256
            )
            for s, r, sha256 in zip(stages, ranges, hashes, strict=True)
        ),
        split_plan=plan, boundary_dtype=pipeline.boundary_dtype,
        boundaries=tuple(BoundaryRecord.of(s.output) for s in stages[:-1]),
        split_max_rel_error=split.max_rel_error, compression_max_rel_error=compression,
        artifact_max_rel_error=artifacts.max_rel_error, build_id=build_id,
    )  # fmt: skip


def build_pipeline(
    pipeline: PipelineSpec, spec: ModelSpec, repository: Path, num_gpus: int, plan: SplitPlan | None = None
) -> BuiltPipeline:
    """Build the ensemble and its stages, reusing an identical earlier build (or ``plan``'s cuts)."""
    model = build_torch_model(spec)
    plain = json.dumps([dataclasses.asdict(pipeline), BUILD_VERSION], sort_keys=True, default=list)
    digest = hashlib.sha256((content_hash(spec, model) + plain).encode()).hexdigest()
    record = _recorded(repository, pipeline, digest)
    build_id = record.build_id if record is not None else secrets.token_hex(BUILD_ID_BYTES)
    stages, plan = make_stages(pipeline, spec, model, (record and record.split_plan) or plan, build_id)
    pipeline_configs(pipeline, spec, stages, num_gpus)  # placement errors before the slow work
    cached = record is not None
    record = record or _export(pipeline, spec, model, stages, plan, repository, digest, build_id)
    configs = pipeline_configs(pipeline, spec, stages, num_gpus, {s.name: s.sha256 for s in record.stages})
    (repository / pipeline.name / "1").mkdir(parents=True, exist_ok=True)  # ensembles need a version
    for stage in stages:  # the torch stage runner and the helpers it imports beside the artifact
        if stage.runtime == "torch_export":
            python_backend.install(python_backend.TORCH_STAGE, repository / stage.name / "1")
    for config in configs:
        write_config(config, repository / config.name)
    write_record(repository / pipeline.name / RECORD, record.to_json())
    log.info("%s: %s stages %s", pipeline.name, "cached" if cached else "exported", [s.name for s in stages])
    return BuiltPipeline(pipeline, record, configs, cached)


def build_pipelines(
    spec: Spec, repository: Path, num_gpus: int, only: Iterable[str] | None = None,
    on_pipeline: Callable[[PipelineSpec], None] | None = None,
) -> list[BuiltPipeline]:  # fmt: skip
    """Build every pipeline of ``spec`` (or those named in ``only``); pipelines cutting the same model
    into the same stages share one plan, so variants differ only as the spec says, not by timing noise."""
    wanted = None if only is None else set(only)
    built: list[BuiltPipeline] = []
    plans: dict[tuple, SplitPlan] = {}
    for pipeline in [p for p in spec.pipelines if wanted is None or p.name in wanted]:
        if on_pipeline is not None:
            on_pipeline(pipeline)
        key = (pipeline.model, pipeline.split, pipeline.stages, pipeline.balance, pipeline.cut_points)
        try:
            item = build_pipeline(pipeline, spec.model(pipeline.model), repository, num_gpus, plans.get(key))
        except SpecError as error:
            if error.path.startswith(pipeline.name):
                raise
            raise SpecError(f"{pipeline.name}.{error.path}", error.problem) from error
        if item.record.split_plan is not None:
            plans.setdefault(key, item.record.split_plan)
        built.append(item)
    return built
