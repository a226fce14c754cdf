"""The check's repository, built where it is served with that machine's torch (a ``.pt2`` does not travel
between versions): every model torch through the Python backend, the one GPU path there, each program
checked against the eager fp32 model before it is written. ``recommender_dynamic`` has no queue policy:
its 2.51 stall would swamp the figures (docs/SERVING.md row 11)."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import python_backend
from exporters.artifacts.parity import ParityReport, compare_outputs
from exporters.artifacts.records import file_sha256
from exporters.configs.model_config import InstanceGroup, write_config
from exporters.configs.models import build_model_config
from exporters.pipelines.build import BuiltPipeline, build_pipelines
from exporters.pipelines.configs import torch_program_config
from exporters.pipelines.stages import Stage, load_stage, stage_artifact
from exporters.schema.models import ModelSpec, Spec
from exporters.schema.sections import Batching
from exporters.sources.inputs import draw_inputs
from exporters.sources.load import build_torch_model
from gpucheck.grid import Grid
from perf.plan.strategy import precision_variant

log = logging.getLogger(__name__)

BATCHING_MODEL = "recommender"
INSTANCE_MODEL = "image_classifier"
NO_BATCHER = Batching(mode="none")


@dataclass(frozen=True)
class CheckModel:
    """One served model of the check: the spec as served, what it is a variant of, and its placement."""

    spec: ModelSpec
    base: str  # the models.yaml entry it serves
    precision: str
    instances: int = 1


@dataclass(frozen=True)
class BuiltCheckModel:
    model: CheckModel
    parity: ParityReport  # the written program against the eager fp32 model


@dataclass
class CheckRepository:
    path: Path
    device: str  # "gpu" (KIND_GPU on GPU 0) or "cpu" (KIND_CPU)
    models: dict[str, BuiltCheckModel]
    pipelines: dict[str, BuiltPipeline]


def _at_grid_batch(model: ModelSpec, grid: Grid, **changes: Any) -> ModelSpec:
    return dataclasses.replace(model, **{"max_batch_size": grid.max_batch, "batching": NO_BATCHER, **changes})


def check_models(spec: Spec, grid: Grid) -> list[CheckModel]:
    models = []
    for base, precision in grid.latency_models:
        entry = _at_grid_batch(spec.model(base), grid)
        models.append(CheckModel(precision_variant(entry, precision), base, precision))
    recommender = spec.model(BATCHING_MODEL)
    dynamic = Batching(mode="dynamic", max_queue_delay_us=recommender.batching.max_queue_delay_us)
    served = _at_grid_batch(recommender, grid, name=f"{BATCHING_MODEL}_dynamic", batching=dynamic)
    models.append(CheckModel(served, BATCHING_MODEL, "fp32"))
    for count in grid.instances:
        if count > 1:
            served = _at_grid_batch(spec.model(INSTANCE_MODEL), grid, name=f"{INSTANCE_MODEL}_x{count}")
            models.append(CheckModel(served, INSTANCE_MODEL, "fp32", count))
    models.append(CheckModel(payload_spec(spec, grid.shm_mib), "trivial", "fp32"))
    return models


def payload_spec(spec: Spec, mib: int) -> ModelSpec:
    """The zoo's doubler taking one fp32 input of ``mib`` MiB, batch 1."""
    features = mib * (1 << 20) // 4
    trivial = spec.model("trivial")
    return dataclasses.replace(
        trivial,
        name=f"payload_{mib}mib",
        options={**trivial.options, "features": features},
        max_batch_size=1,
        batching=NO_BATCHER,
        inputs=(dataclasses.replace(trivial.inputs[0], shape=(features,)),),
        outputs=(dataclasses.replace(trivial.outputs[0], shape=(features,)),),
    )


def torch_module(model: CheckModel) -> torch.nn.Module:
    """The eager module serving ``model``: fp32, or its float parameters in fp16 for an fp16 variant."""
    module = build_torch_model(model.spec).eval()
    return module.half() if model.precision == "fp16" else module


def build_check_model(model: CheckModel, repository: Path, device: str) -> BuiltCheckModel:
    """Export ``model`` as one torch program, check it against the eager fp32 model, write its config."""
    spec = model.spec
    module = torch_module(model)
    reference = build_torch_model(spec).eval()
    stage = Stage(spec.name, module, tuple(spec.inputs), spec.outputs[0], "torch_export")
    example = tuple(torch.from_numpy(a) for a in draw_inputs(spec, min(3, spec.max_batch_size), 7, reference))
    folder = repository / spec.name / "1"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / stage.artifact_name
    path.write_bytes(stage_artifact(stage, example, spec.max_batch_size))
    loaded = load_stage(stage, path)  # through the server's no-pickle gate
    sample = [torch.from_numpy(a) for a in draw_inputs(spec, min(4, spec.max_batch_size), 11, reference)]
    with torch.inference_mode():
        actual = loaded(*sample).float().numpy()
        expected = reference(*(t.float() if t.is_floating_point() else t for t in sample)).numpy()
    parity = compare_outputs(
        [actual], [expected], model.precision, f"{spec.name} (torch program vs eager fp32)"
    )
    python_backend.install(python_backend.TORCH_STAGE, folder)
    config = build_model_config(spec, 1 if device == "gpu" else 0)
    config = torch_program_config(config, spec, stage, file_sha256(path))
    kind, gpus = ("KIND_GPU", [0]) if device == "gpu" else ("KIND_CPU", [])
    config.instance_group = [InstanceGroup(kind, model.instances, gpus)]
    write_config(config, repository / spec.name)
    return BuiltCheckModel(model, parity)


def check_spec(spec: Spec, grid: Grid) -> Spec:
    """``spec`` with the check's pipelines, their stages batching with no queue delay (comparable with the
    monolith)."""
    image = _at_grid_batch(spec.model(INSTANCE_MODEL), grid)
    pipelines = tuple(
        dataclasses.replace(p, batching=Batching(mode="dynamic", max_queue_delay_us=0))
        for p in spec.pipelines
        if p.name in grid.pipelines
    )
    models = tuple(image if m.name == INSTANCE_MODEL else m for m in spec.models)
    return dataclasses.replace(spec, models=models, pipelines=pipelines, text_embeddings=())


def build(spec: Spec, grid: Grid, repository: Path, device: str) -> CheckRepository:
    repository.mkdir(parents=True, exist_ok=True)
    built = {}
    for model in check_models(spec, grid):
        name = model.spec.name
        log.info("building %s (%s, %d instance(s) on %s)", name, model.precision, model.instances, device)
        built[name] = build_check_model(model, repository, device)
    pipelines = build_pipelines(check_spec(spec, grid), repository, num_gpus=1 if device == "gpu" else 0)
    return CheckRepository(repository, device, built, {p.spec.name: p for p in pipelines})
