"""A pipeline's stages as torch modules over the ensemble's named tensors, both kinds of split alike.
Compressed boundaries live inside the stage modules (a stage casts its output to the boundary dtype, the
next casts it back to fp32), so neither the runner nor the ensemble knows of compression."""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

from exporters.artifacts.onnx_files import check_external_data, module_to_onnx
from exporters.artifacts.parity import ParityReport, compare_outputs, worst_of
from exporters.errors import ExporterError, SpecError, StageExportError
from exporters.pipelines.splitter import SplitPlan, plan_split, split_blocks
from exporters.schema.models import ModelSpec, PipelineSpec
from exporters.schema.sections import TensorSpec
from exporters.zoo.recommender import Recommender
from python_backend.dtypes import DTYPES

EMBEDDINGS = "embeddings"  # the recommender's boundary tensor (named per build: ``boundary_name``)
Tensors = dict[str, torch.Tensor]
StageFn = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class Stage:
    """One stage: its Triton model name, the module it runs, and its named tensors (one output)."""

    name: str
    module: nn.Module
    inputs: tuple[TensorSpec, ...]
    output: TensorSpec
    runtime: Literal["torch_export", "onnx"]
    embedding_tables: tuple[str, ...] = ()  # parameter names that take live row updates

    @property
    def artifact_name(self) -> str:
        return "stage.pt2" if self.runtime == "torch_export" else "model.onnx"


class BoundaryCasts(nn.Module):
    """Runs ``inner`` in fp32: widens a compressed input, narrows the output for the next boundary."""

    def __init__(self, inner: nn.Module, widen_input: bool, output_dtype: torch.dtype | None) -> None:
        super().__init__()
        self.inner, self.widen_input, self.output_dtype = inner, widen_input, output_dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.inner(x.float() if self.widen_input else x)
        return out if self.output_dtype is None else out.to(self.output_dtype)


class DenseFromCompressed(nn.Module):
    """The recommender's dense network taking embeddings that crossed the boundary compressed."""

    def __init__(self, dense: nn.Module) -> None:
        super().__init__()
        self.dense = dense

    def forward(self, dense: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
        return self.dense(dense, embeddings.float())


def run_stages(stages: Sequence[Stage], inputs: Tensors, fns: Sequence[StageFn] | None = None) -> Tensors:
    """Run the stages in order over named tensors (``fns`` replace the modules, e.g. loaded artifacts)."""
    tensors = dict(inputs)
    with torch.no_grad():  # not inference_mode: the outputs serve as torch.export examples
        for index, stage in enumerate(stages):
            fn = fns[index] if fns is not None else stage.module
            tensors[stage.output.name] = fn(*(tensors[t.name] for t in stage.inputs))
    return tensors


def check_stages(
    stages: Sequence[Stage], expected: Callable[[Tensors], torch.Tensor], samples: Sequence[Tensors],
    precision: str, what: str, fns: Sequence[StageFn] | None = None,
) -> ParityReport:  # fmt: skip
    """The worst parity of the stage chain's final output against ``expected`` over ``samples``."""
    reports = []
    for sample in samples:
        actual = run_stages(stages, sample, fns)[stages[-1].output.name].float()
        with torch.inference_mode():
            reference = expected(sample).float()
        reports.append(compare_outputs([actual.numpy()], [reference.numpy()], precision, what))
    return worst_of(reports)


def boundary_name(base: str, build_id: str) -> str:
    """A boundary tensor named for the build that made the stages: Triton chains stages by name, so a
    stage reloaded after a rebuild fails to chain instead of silently serving a mixed model."""
    return f"{base}_{build_id}" if build_id else base


def block_stages(
    pipeline: PipelineSpec, spec: ModelSpec, model: nn.Module, example: torch.Tensor, plan: SplitPlan | None,
    build_id: str = "",
) -> tuple[list[Stage], SplitPlan]:  # fmt: skip
    """Cut an ``nn.Sequential`` (at ``plan``'s cuts, or planned now) into stages with boundary casts."""
    if plan is None:
        plan = plan_split(
            model, example, pipeline.stages, pipeline.name, pipeline.cut_points, pipeline.balance,
            threads=max(spec.threads.intra_op, 1),
        )  # fmt: skip
    parts = split_blocks(model, plan, pipeline.name)
    compress = None if pipeline.boundary_dtype == "fp32" else DTYPES[pipeline.boundary_dtype].torch_dtype()
    stages, tensor, x = [], spec.inputs[0], example
    with torch.inference_mode():
        for index, (part, name) in enumerate(zip(parts, pipeline.stage_names, strict=True)):
            x = part(x)
            last = index == len(parts) - 1
            name_out = boundary_name(f"boundary{index + 1}", build_id)
            output = (
                spec.outputs[0] if last else TensorSpec(name_out, pipeline.boundary_dtype, tuple(x.shape[1:]))
            )
            module = BoundaryCasts(
                part, widen_input=index > 0 and compress is not None, output_dtype=None if last else compress
            )
            stages.append(Stage(name, module, (tensor,), output, "torch_export"))
            tensor = output
    return stages, plan


def embedding_dense_stages(
    pipeline: PipelineSpec, spec: ModelSpec, model: nn.Module, build_id: str = ""
) -> list[Stage]:
    """The recommender's embedding tables (torch, updatable) and dense network (ONNX) as two stages."""
    if not isinstance(model, Recommender):
        raise SpecError(
            f"{pipeline.name}.split", f"embedding_dense needs a Recommender, got {type(model).__name__}"
        )
    by_name = {t.name: t for t in spec.inputs}
    if set(by_name) != {"dense", "sparse_ids"}:
        raise SpecError(
            f"{pipeline.name}.model",
            f"recommender inputs must be dense and sparse_ids, got {sorted(by_name)}",
        )
    compress = pipeline.boundary_dtype != "fp32"
    dims = (len(model.table_sizes), model.embed.tables[0].embedding_dim)
    embeddings = TensorSpec(boundary_name(EMBEDDINGS, build_id), pipeline.boundary_dtype, dims)
    cast = DTYPES[pipeline.boundary_dtype].torch_dtype() if compress else None
    embed = BoundaryCasts(model.embed, False, cast)
    tables = tuple(f"inner.tables.{i}.weight" for i in range(len(model.table_sizes)))
    dense = DenseFromCompressed(model.dense) if compress else model.dense
    embedding_name, dense_name = pipeline.stage_names
    return [
        Stage(embedding_name, embed, (by_name["sparse_ids"],), embeddings, "torch_export", tables),
        Stage(dense_name, dense, (by_name["dense"], embeddings), spec.outputs[0], "onnx"),
    ]


def stage_artifact(stage: Stage, example: tuple[torch.Tensor, ...], max_batch_size: int) -> bytes:
    """The stage's artifact, ONNX or a ``torch.export`` program with a dynamic batch axis, made in memory
    (torch's zip writer aborts the process when the disk fills mid-file); failures name the stage."""
    try:
        if stage.runtime == "onnx":
            return module_to_onnx(stage.module, example, [t.name for t in stage.inputs], [stage.output.name])
        dynamic = None
        if max_batch_size > 1:  # torch.export has no Dim with min == max
            batch = torch.export.Dim("batch", min=1, max=max_batch_size)
            dynamic = tuple({0: batch} for _ in example)
        program = torch.export.export(stage.module, example, dynamic_shapes=dynamic)
        buffer = io.BytesIO()
        torch.export.save(program, buffer)
        return buffer.getvalue()
    except ExporterError:
        raise
    except Exception as error:
        raise StageExportError(
            f"stage {stage.name}: {stage.runtime} export failed: {type(error).__name__}: {error}"
        ) from error


def check_stage_file(stage: Stage, path: Path) -> None:
    """An ONNX stage passes ``onnx.checker`` and keeps its data in its folder (a ``.pt2`` is run instead)."""
    if stage.runtime != "onnx":
        return
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as error:
        raise StageExportError(f"stage {stage.name}: {path.name} fails onnx.checker: {error}") from error
    check_external_data(path)


def export_stage(stage: Stage, example: tuple[torch.Tensor, ...], max_batch_size: int, path: Path) -> None:
    path.write_bytes(stage_artifact(stage, example, max_batch_size))
    check_stage_file(stage, path)


def load_stage(stage: Stage, path: Path) -> StageFn:
    """Load an artifact this build just wrote the way the server will, as a callable."""
    try:
        if stage.runtime == "torch_export":
            return torch.export.load(io.BytesIO(path.read_bytes())).module()
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as error:
        raise StageExportError(
            f"stage {stage.name}: {path.name} does not load back: {type(error).__name__}: {error}"
        ) from error
    names = [t.name for t in stage.inputs]

    def run(*tensors: torch.Tensor) -> torch.Tensor:
        feeds = {n: t.numpy() for n, t in zip(names, tensors, strict=True)}
        return torch.from_numpy(np.asarray(session.run([stage.output.name], feeds)[0]))

    return run


def stage_examples(stages: Sequence[Stage], inputs: Tensors) -> list[tuple[torch.Tensor, ...]]:
    tensors = run_stages(stages, inputs)
    return [tuple(tensors[t.name] for t in stage.inputs) for stage in stages]
