"""Triton configs of a pipeline: one model per stage, placed on its own device, and the ensemble. Every
stage batches dynamically: an ensemble hands each request to each stage separately, so a batch does not
survive it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from exporters.configs.model_config import InstanceGroup, ModelConfig, ModelInput, ModelTensor
from exporters.configs.models import build_model_config, chained_ensemble, model_tensor, resolve_target
from exporters.errors import SpecError
from exporters.pipelines.stages import Stage
from exporters.schema.guards import guard_parameters
from exporters.schema.models import ModelSpec, PipelineSpec
from exporters.schema.sections import DTYPES, Batching
from python_backend.torch_stage.embedding_rows import UPDATE_ROW, UPDATE_TABLE, UPDATE_VALUES, UPDATE_VERSION

# Stages after the first receive each upstream batch as a burst of requests released together, so a
# short wait re-forms the batch; the first stage's longer wait would only add latency per boundary.
DOWNSTREAM_QUEUE_DELAY_US = 100


def stage_placement(
    pipeline: PipelineSpec, spec: ModelSpec, index: int, num_gpus: int
) -> list[InstanceGroup]:
    """Stage ``index`` on the GPU the pipeline pins, else ``index mod num_gpus`` (or the CPU)."""
    count = pipeline.stage_replicas(index)
    if resolve_target(spec, num_gpus) == "cpu":
        return [InstanceGroup(kind="KIND_CPU", count=count)]
    gpu = pipeline.gpus[index] if pipeline.gpus else index % num_gpus
    if gpu >= num_gpus:
        raise SpecError(f"{pipeline.name}.gpus", f"GPU {gpu} does not exist (planned GPUs: {num_gpus})")
    return [InstanceGroup(kind="KIND_GPU", count=count, gpus=[gpu])]


def stage_batching(pipeline: PipelineSpec, index: int) -> Batching:
    """The pipeline's batching on the first stage; the same with a short queue delay downstream."""
    if index == 0:
        return pipeline.batching
    delay = min(pipeline.batching.max_queue_delay_us, DOWNSTREAM_QUEUE_DELAY_US)
    return dataclasses.replace(pipeline.batching, max_queue_delay_us=delay)


def stage_config(
    pipeline: PipelineSpec, spec: ModelSpec, stage: Stage, index: int, num_gpus: int, sha256: str = ""
) -> ModelConfig:
    """An ONNX stage is an ordinary ``onnxruntime`` model; a torch stage runs on the Python backend,
    refusing any artifact but the one of ``sha256`` (a rebuilt file under this older config)."""
    config = build_model_config(
        spec, num_gpus, name=stage.name, inputs=stage.inputs, outputs=(stage.output,),
        batching=stage_batching(pipeline, index),
    )  # fmt: skip
    config.instance_group = stage_placement(pipeline, spec, index, num_gpus)
    if stage.runtime == "onnx":
        return config
    config = torch_program_config(config, spec, stage, sha256)
    if not (stage.embedding_tables and pipeline.live_updates):
        return config
    # Update requests carry no ids and lookups no updates: every input is optional (``embedding_rows``).
    updates = [
        (UPDATE_TABLE, DTYPES["int64"], [1]),
        (UPDATE_ROW, DTYPES["int64"], [1]),
        (UPDATE_VALUES, DTYPES["fp32"], [stage.output.shape[-1]]),
    ]
    return dataclasses.replace(
        config,
        input=[ModelInput(t.name, t.data_type, t.dims, optional=True) for t in config.input]
        + [ModelInput(*update, optional=True) for update in updates],
        output=[*config.output, ModelTensor(UPDATE_VERSION, DTYPES["int64"], [1])],
        parameters={**config.parameters, "embedding_tables": ",".join(stage.embedding_tables)},
    )


def torch_program_config(config: ModelConfig, spec: ModelSpec, stage: Stage, sha256: str = "") -> ModelConfig:
    """``config`` served by the torch stage runner on the Python backend, running ``stage``'s ``.pt2`` on
    its instance group's device (a pipeline stage, or a whole model in the GPU check)."""
    parameters = {
        "stage_program": stage.artifact_name,
        **({"stage_sha256": sha256} if sha256 else {}),
        "intra_op_thread_count": str(spec.threads.intra_op),
        # Hand GPU tensors over as they are (DLPack); the default copies every input to the host.
        "FORCE_CPU_ONLY_INPUT_TENSORS": "no",
        **guard_parameters(
            {t.name: t.range for t in spec.inputs if t.range and t.name in {i.name for i in stage.inputs}},
            spec.allow_non_finite,
        ),
    }
    return dataclasses.replace(config, backend="python", parameters=parameters, gpu_execution_accelerator=[])


def pipeline_configs(
    pipeline: PipelineSpec, spec: ModelSpec, stages: Sequence[Stage], num_gpus: int,
    artifacts: Mapping[str, str] | None = None,
) -> list[ModelConfig]:  # fmt: skip
    """The ensemble's config, then each stage's; ``artifacts`` maps stage names to their SHA-256."""
    hashes = artifacts or {}
    steps = [(stage.name, [t.name for t in stage.inputs], [stage.output.name]) for stage in stages]
    inputs, outputs = ([model_tensor(t) for t in tensors] for tensors in (spec.inputs, spec.outputs))
    return [
        chained_ensemble(pipeline.name, spec.max_batch_size, inputs, outputs, steps),
        *(stage_config(pipeline, spec, s, k, num_gpus, hashes.get(s.name, "")) for k, s in enumerate(stages)),
    ]
