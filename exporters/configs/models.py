"""Turn a ``ModelSpec`` into a Triton ``ModelConfig``: batching, placement (one ``KIND_GPU`` entry per
GPU, data-parallel replicas, or one ``KIND_CPU`` entry; ``auto`` by the GPUs planned), warm-up, threads."""

from __future__ import annotations

from collections.abc import Sequence

from exporters.configs.model_config import (
    EnsembleStep,
    InstanceGroup,
    ModelConfig,
    ModelDynamicBatching,
    ModelQueuePolicy,
    ModelTensor,
    ModelWarmup,
    WarmupInput,
)
from exporters.errors import SpecError
from exporters.schema.guards import guard_parameters
from exporters.schema.models import ModelSpec
from exporters.schema.sections import DTYPES, Batching, TensorSpec

# Asks the python-based onnxruntime backend to warm the sizes the loaded config forms beyond the
# config's batch-1 warm-up (python_backend/onnxruntime/model.py reads it; the native backend ignores it).
WARMUP_PARAMETER = "warmup_formed_sizes"

# Triton 2.51: with a queue policy, requests that all came while every instance was busy wait out the
# batcher's 500 ms sleep (docs/SERVING.md, row 11); with this many instances per device one is almost
# always idle (perf/studies/queue_policy_study.py measures it).
QUEUE_POLICY_SPARE_INSTANCES = 4

# An int8 (QDQ) model asks TensorRT for INT8: its Q/DQ pairs are explicit precision, no calibration cache.
TENSORRT_FP16, TENSORRT_INT8 = (
    {"name": "tensorrt", "parameters": {"precision_mode": mode, "max_workspace_size_bytes": str(1 << 30)}}
    for mode in ("FP16", "INT8")
)


def resolve_target(spec: ModelSpec, num_gpus: int) -> str:
    """``cpu`` or ``gpu``: ``auto`` picks GPU when the planned machine has one."""
    if spec.target == "gpu" and num_gpus == 0:
        raise SpecError(f"{spec.name}.target", "is gpu but no GPU is planned (detected none; pass --gpus N)")
    if spec.target == "auto":
        return "gpu" if num_gpus > 0 else "cpu"
    return spec.target


def instance_groups(spec: ModelSpec, num_gpus: int) -> list[InstanceGroup]:
    """One ``KIND_GPU`` entry per selected GPU, or one ``KIND_CPU`` entry."""
    if resolve_target(spec, num_gpus) == "cpu":
        return [InstanceGroup(kind="KIND_CPU", count=spec.instances.cpu)]
    gpus = range(num_gpus) if spec.instances.gpus == "all" else spec.instances.gpus
    for gpu in gpus:
        if gpu >= num_gpus:
            raise SpecError(
                f"{spec.name}.instances.gpus", f"GPU {gpu} does not exist (planned GPUs: {num_gpus})"
            )
    return [InstanceGroup(kind="KIND_GPU", count=spec.instances.per_gpu, gpus=[gpu]) for gpu in gpus]


def model_tensor(tensor: TensorSpec) -> ModelTensor:
    """A spec tensor as a config ``input``/``output`` (``-1`` stays a variable axis)."""
    return ModelTensor(tensor.name, DTYPES[tensor.dtype], list(tensor.shape))


def dynamic_batching(batching: Batching) -> ModelDynamicBatching | None:
    if batching.mode != "dynamic":
        return None
    queue = batching.queue
    policy = queue and ModelQueuePolicy(
        queue.timeout_action.upper(), queue.timeout_us, False, queue.max_queue_size
    )
    return ModelDynamicBatching(list(batching.preferred_batch_sizes), batching.max_queue_delay_us, policy)


def lacks_spare_instances(config: ModelConfig) -> bool:
    """Whether a queue policy meets fewer than ``QUEUE_POLICY_SPARE_INSTANCES`` instances on a device."""
    batching = config.dynamic_batching
    if batching is None or batching.default_queue_policy is None or not config.instance_group:
        return False
    return min(group.count for group in config.instance_group) < QUEUE_POLICY_SPARE_INSTANCES


def warmups(spec: ModelSpec, inputs: Sequence[TensorSpec], batching: Batching) -> list[ModelWarmup]:
    """So the first real request pays no setup cost: batch 1 (static batching: its one size), so a config
    whose ``max_batch_size`` is lowered later still loads (our backend warms the sizes it forms); variable
    axes at ``max_shape``, all zeros: random ids could leave a table, random floats hold NaN/Inf."""
    if not spec.warmup:
        return []
    for tensor in inputs:
        if tensor.range is not None and not tensor.range[0] <= 0 < tensor.range[1]:
            raise SpecError(
                f"{spec.name}.warmup",
                f"warm-up sends zeros, outside {tensor.name}'s range {list(tensor.range)}; set warmup: false",
            )
    size = batching.batch_size if batching.mode == "static" else 1
    zeros = {t.name: WarmupInput(DTYPES[t.dtype], list(t.largest), zero_data=True) for t in inputs}
    return [ModelWarmup(name=f"batch_{size}", batch_size=size, inputs=zeros)]


def build_model_config(
    spec: ModelSpec, num_gpus: int, *, name: str | None = None, inputs: Sequence[TensorSpec] | None = None,
    outputs: Sequence[TensorSpec] | None = None, batching: Batching | None = None,
) -> ModelConfig:  # fmt: skip
    """The ``config.pbtxt`` of an ONNX model on ``onnxruntime``; a pipeline stage passes its own name,
    tensors and ``batching`` (e.g. fp16 boundaries of an fp32 model)."""
    on_gpu = resolve_target(spec, num_gpus) == "gpu"
    # TensorRT on GPU targets: INT8 for an int8 model, FP16 when the spec asks for it.
    tensorrt = TENSORRT_INT8 if spec.precision == "int8" else TENSORRT_FP16 if spec.tensorrt_fp16 else None
    accelerators = [tensorrt] if tensorrt and on_gpu else []
    inputs = spec.inputs if inputs is None else inputs
    outputs = spec.outputs if outputs is None else outputs
    batching = spec.batching if batching is None else batching
    return ModelConfig(
        name=name or spec.name,
        backend="onnxruntime",
        max_batch_size=spec.max_batch_size,
        input=[model_tensor(t) for t in inputs],
        output=[model_tensor(t) for t in outputs],
        instance_group=instance_groups(spec, num_gpus),
        dynamic_batching=dynamic_batching(batching),
        model_warmup=warmups(spec, inputs, batching),
        parameters={
            "intra_op_thread_count": str(spec.threads.intra_op),
            "inter_op_thread_count": str(spec.threads.inter_op),
            **({WARMUP_PARAMETER: "true"} if spec.warmup and batching.mode == "dynamic" else {}),
            **guard_parameters(
                {t.name: t.range for t in inputs if t.range is not None},
                spec.allow_non_finite,
                {t.name: t.largest for t in inputs if t.variable},
            ),
        },
        gpu_execution_accelerator=accelerators,
    )


def chained_ensemble(
    name: str, max_batch_size: int, inputs: list[ModelTensor], outputs: list[ModelTensor],
    steps: Sequence[tuple[str, Sequence[str], Sequence[str]]],
) -> ModelConfig:  # fmt: skip
    """An ensemble whose ``steps`` (a model, the tensors it reads, the tensors it writes) pass tensors by
    name: every step reads and writes the ensemble's tensor of the same name (pipelines, text services)."""
    return ModelConfig(
        name=name,
        platform="ensemble",
        max_batch_size=max_batch_size,
        input=inputs,
        output=outputs,
        ensemble_steps=[
            EnsembleStep(model_name=model, input_map={n: n for n in reads}, output_map={n: n for n in writes})
            for model, reads, writes in steps
        ],
    )
