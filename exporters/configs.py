"""Turn a ``ModelSpec`` into a Triton ``ModelConfig``: batching, placement, warm-up, threads.

Placement rule: GPU targets get one ``instance_group`` entry per GPU (``count`` instances each), so
Triton runs data-parallel replicas on every card; CPU targets get a single ``KIND_CPU`` entry. ``auto``
chooses by the number of GPUs the build is planned for (detected, or given with ``--gpus``).
"""

from __future__ import annotations

from exporters.errors import SpecError
from exporters.guards import guard_parameters
from exporters.model_config import (
    InstanceGroup,
    ModelConfig,
    ModelDynamicBatching,
    ModelQueuePolicy,
    ModelTensor,
    ModelWarmup,
    WarmupInput,
)
from exporters.spec import DTYPES, ModelSpec

TENSORRT_FP16 = {
    "name": "tensorrt",
    "parameters": {"precision_mode": "FP16", "max_workspace_size_bytes": str(1 << 30)},
}


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


def dynamic_batching(spec: ModelSpec) -> ModelDynamicBatching | None:
    if spec.batching.mode != "dynamic":
        return None
    queue = spec.batching.queue
    policy = None
    if queue is not None:
        policy = ModelQueuePolicy(
            timeout_action=queue.timeout_action.upper(),
            default_timeout_microseconds=queue.timeout_us,
            max_queue_size=queue.max_queue_size,
        )
    return ModelDynamicBatching(
        preferred_batch_size=list(spec.batching.preferred_batch_sizes),
        max_queue_delay_microseconds=spec.batching.max_queue_delay_us,
        default_queue_policy=policy,
    )


def warmups(spec: ModelSpec) -> list[ModelWarmup]:
    """Warm up at every batch size the server will form, so the first real batch pays no setup cost.

    Every input warms up with zeros: random ids could fall outside an embedding table, and Triton's
    ``random_data`` fills floats with random bytes, which include NaN/Inf bit patterns that the input
    guards reject (the warm-up then fails the model's load).
    """
    if not spec.warmup:
        return []
    return [
        ModelWarmup(
            name=f"batch_{size}",
            batch_size=size,
            inputs={
                t.name: WarmupInput(DTYPES[t.dtype], list(t.shape), zero_data=True, random_data=False)
                for t in spec.inputs
            },
        )
        for size in spec.formed_batch_sizes
    ]


def build_model_config(spec: ModelSpec, num_gpus: int) -> ModelConfig:
    """The complete ``config.pbtxt`` for an ONNX model served by the ``onnxruntime`` backend."""
    target = resolve_target(spec, num_gpus)
    return ModelConfig(
        name=spec.name,
        backend="onnxruntime",
        max_batch_size=spec.max_batch_size,
        input=[ModelTensor(t.name, DTYPES[t.dtype], list(t.shape)) for t in spec.inputs],
        output=[ModelTensor(t.name, DTYPES[t.dtype], list(t.shape)) for t in spec.outputs],
        instance_group=instance_groups(spec, num_gpus),
        dynamic_batching=dynamic_batching(spec),
        model_warmup=warmups(spec),
        parameters={
            "intra_op_thread_count": str(spec.intra_op_threads),
            "inter_op_thread_count": str(spec.inter_op_threads),
            **guard_parameters(
                {t.name: t.range for t in spec.inputs if t.range is not None}, spec.allow_non_finite
            ),
        },
        gpu_execution_accelerator=[TENSORRT_FP16] if target == "gpu" and spec.tensorrt_fp16 else [],
    )
