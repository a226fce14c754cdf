"""The declarative spec (``models.yaml``): what to serve and how to batch and place it.

Parsing is strict: unknown keys, wrong types and impossible values raise ``SpecError`` naming the field
path (``models[1].batching.max_queue_delay_us: must be >= 0``), because a typo in a serving config
otherwise surfaces as a silently different deployment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from exporters.errors import SpecError
from exporters.zoo import ZOO

DTYPES = {
    "fp32": "TYPE_FP32", "fp16": "TYPE_FP16", "int64": "TYPE_INT64", "int32": "TYPE_INT32",
    "bf16": "TYPE_BF16",  # only between pipeline stages (compressed boundaries); models take MODEL_DTYPES
}  # fmt: skip
MODEL_DTYPES = ("fp32", "fp16", "int64", "int32")
BatchingMode = Literal["none", "static", "dynamic"]
Target = Literal["auto", "cpu", "gpu"]
SplitKind = Literal["blocks", "embedding_dense"]
Balance = Literal["latency", "flops", "params"]
BoundaryDtype = Literal["fp32", "fp16", "bf16"]


@dataclass(frozen=True)
class TensorSpec:
    """One input or output; ``shape`` excludes the batch dimension (Triton's convention)."""

    name: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class QueuePolicy:
    """Bounds the batcher's queue so overload is rejected instead of growing without limit."""

    max_queue_size: int = 0
    timeout_us: int = 0
    timeout_action: Literal["reject", "delay"] = "reject"


@dataclass(frozen=True)
class Batching:
    mode: BatchingMode = "dynamic"
    max_queue_delay_us: int = 1000
    preferred_batch_sizes: tuple[int, ...] = ()
    batch_size: int = 0
    queue: QueuePolicy | None = None


@dataclass(frozen=True)
class Instances:
    """``cpu`` instances on CPU targets; ``per_gpu`` instances on each GPU listed in ``gpus`` (or all)."""

    cpu: int = 1
    per_gpu: int = 1
    gpus: Literal["all"] | tuple[int, ...] = "all"


@dataclass(frozen=True)
class ModelSpec:
    name: str
    source: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int
    options: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    precision: Literal["fp32", "fp16"] = "fp32"
    batching: Batching = Batching()
    instances: Instances = Instances()
    target: Target = "auto"
    intra_op_threads: int = 1
    inter_op_threads: int = 1
    tensorrt_fp16: bool = False
    warmup: bool = True

    @property
    def formed_batch_sizes(self) -> tuple[int, ...]:
        """Batch sizes the server will run: what the batcher forms, or the static batch size."""
        if self.batching.mode == "static":
            return (self.batching.batch_size,)
        if self.batching.mode == "dynamic":
            return tuple(sorted({1, *self.batching.preferred_batch_sizes, self.max_batch_size}))
        return (1,)


@dataclass(frozen=True)
class PipelineSpec:
    """A model served as an ensemble of stages on different devices (model/pipeline parallel).

    ``model`` names the monolithic entry of ``models`` that is split (and that the pipeline must
    equal). ``split: blocks`` cuts an ``nn.Sequential`` into ``stages`` contiguous stages (at
    ``cut_points`` or balanced by ``balance``); ``split: embedding_dense`` puts the recommender's
    embedding tables and its dense network in two stages. ``replicas[k]`` instances serve stage k
    (hybrid parallel); ``boundary_dtype`` compresses the activations that cross stage boundaries.
    """

    name: str
    model: str
    split: SplitKind
    stages: int = 2
    cut_points: tuple[int, ...] = ()
    balance: Balance = "latency"
    replicas: tuple[int, ...] = ()
    boundary_dtype: BoundaryDtype = "fp32"
    batching: Batching = Batching()  # the first stage's; later stages wait at most 100 µs
    live_updates: bool = False

    def stage_replicas(self, stage: int) -> int:
        return self.replicas[stage] if self.replicas else 1

    @property
    def stage_names(self) -> tuple[str, ...]:
        """The Triton model behind each stage, in pipeline order."""
        if self.split == "embedding_dense":
            return (f"{self.name}_embedding", f"{self.name}_dense")
        return tuple(f"{self.name}_stage{k}" for k in range(self.stages))

    @property
    def repository_names(self) -> tuple[str, ...]:
        """Every model folder the pipeline owns in the repository: the ensemble and its stages."""
        return (self.name, *self.stage_names)


@dataclass(frozen=True)
class Spec:
    models: tuple[ModelSpec, ...]
    pipelines: tuple[PipelineSpec, ...] = ()
    text_embeddings: tuple = ()  # exporters.text_spec.TextEmbeddingSpec entries

    def model(self, name: str) -> ModelSpec:
        for model in self.models:
            if model.name == name:
                return model
        raise SpecError("models", f"no model named {name!r} (have {[m.name for m in self.models]})")

    def pipeline(self, name: str) -> PipelineSpec:
        for pipeline in self.pipelines:
            if pipeline.name == name:
                return pipeline
        have = [p.name for p in self.pipelines]
        raise SpecError("pipelines", f"no pipeline named {name!r} (have {have})")


# --- parsing helpers ---------------------------------------------------------------------------------


def _mapping(data: Any, path: str, allowed: set[str], required: set[str] = frozenset()) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise SpecError(path, f"must be a mapping, got {type(data).__name__}")
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise SpecError(f"{path}.{unknown[0]}", f"unknown field (allowed: {', '.join(sorted(allowed))})")
    missing = sorted(required - set(data))
    if missing:
        raise SpecError(f"{path}.{missing[0]}", "is required")
    return data


def _int(data: dict[str, Any], key: str, path: str, default: int, minimum: int) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{path}.{key}", f"must be an integer, got {value!r}")
    if value < minimum:
        raise SpecError(f"{path}.{key}", f"must be >= {minimum}, got {value}")
    return value


def _choice(data: dict[str, Any], key: str, path: str, default: str, choices: tuple[str, ...]) -> Any:
    value = data.get(key, default)
    if value not in choices:
        raise SpecError(f"{path}.{key}", f"must be one of {', '.join(choices)}; got {value!r}")
    return value


def _tensor(data: Any, path: str) -> TensorSpec:
    data = _mapping(data, path, {"name", "dtype", "shape"}, {"name", "dtype", "shape"})
    name = data["name"]
    if not isinstance(name, str) or not name.isidentifier():
        raise SpecError(f"{path}.name", f"must be an identifier-like string, got {name!r}")
    _choice(data, "dtype", path, "", MODEL_DTYPES)
    shape = data["shape"]
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 1 for d in shape):
        raise SpecError(f"{path}.shape", f"must be a list of positive integers (no batch dim), got {shape!r}")
    return TensorSpec(name, data["dtype"], tuple(shape))


def _tensors(data: Any, path: str) -> tuple[TensorSpec, ...]:
    if not isinstance(data, list) or not data:
        raise SpecError(path, "must be a non-empty list")
    tensors = tuple(_tensor(item, f"{path}[{i}]") for i, item in enumerate(data))
    names = [t.name for t in tensors]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise SpecError(f"{path}[{i}].name", f"duplicate tensor name {name!r}")
    return tensors


def _queue(data: Any, path: str) -> QueuePolicy:
    data = _mapping(data, path, {"max_queue_size", "timeout_us", "timeout_action"})
    return QueuePolicy(
        max_queue_size=_int(data, "max_queue_size", path, 0, 0),
        timeout_us=_int(data, "timeout_us", path, 0, 0),
        timeout_action=_choice(data, "timeout_action", path, "reject", ("reject", "delay")),
    )


def _batching(data: Any, path: str, max_batch_size: int) -> Batching:
    data = _mapping(
        data, path, {"mode", "max_queue_delay_us", "preferred_batch_sizes", "batch_size", "queue"}, {"mode"}
    )
    mode = _choice(data, "mode", path, "dynamic", ("none", "static", "dynamic"))
    delay = _int(data, "max_queue_delay_us", path, 1000, 0)
    preferred = data.get("preferred_batch_sizes", [])
    if not isinstance(preferred, list) or not all(isinstance(s, int) for s in preferred):
        raise SpecError(f"{path}.preferred_batch_sizes", f"must be a list of integers, got {preferred!r}")
    for i, size in enumerate(preferred):
        if not 1 <= size <= max_batch_size:
            raise SpecError(
                f"{path}.preferred_batch_sizes[{i}]",
                f"must be in 1..max_batch_size ({max_batch_size}), got {size}",
            )
    batch_size = _int(data, "batch_size", path, 0, 0)
    if mode == "static" and not 1 <= batch_size <= max_batch_size:
        raise SpecError(f"{path}.batch_size", f"static batching needs 1 <= batch_size <= {max_batch_size}")
    if mode != "dynamic" and (preferred or "queue" in data or "max_queue_delay_us" in data):
        raise SpecError(
            path, f"preferred_batch_sizes, max_queue_delay_us and queue need mode: dynamic (is {mode})"
        )
    queue = _queue(data["queue"], f"{path}.queue") if "queue" in data else None
    return Batching(mode, delay, tuple(sorted(set(preferred))), batch_size, queue)


def _instances(data: Any, path: str) -> Instances:
    data = _mapping(data, path, {"cpu", "per_gpu", "gpus"})
    gpus = data.get("gpus", "all")
    if gpus != "all" and not (
        isinstance(gpus, list)
        and gpus
        and all(isinstance(g, int) and g >= 0 for g in gpus)
        and len(set(gpus)) == len(gpus)
    ):
        raise SpecError(f"{path}.gpus", f"must be 'all' or a list of distinct GPU indices, got {gpus!r}")
    return Instances(
        cpu=_int(data, "cpu", path, 1, 1),
        per_gpu=_int(data, "per_gpu", path, 1, 1),
        gpus="all" if gpus == "all" else tuple(gpus),
    )


MODEL_FIELDS = {
    "name",
    "source",
    "options",
    "seed",
    "inputs",
    "outputs",
    "precision",
    "max_batch_size",
    "batching",
    "instances",
    "target",
    "threads",
    "tensorrt_fp16",
    "warmup",
}


def parse_model(data: Any, path: str) -> ModelSpec:
    """Parse one entry of ``models``; every error names ``path`` and the field."""
    data = _mapping(data, path, MODEL_FIELDS, {"name", "source", "inputs", "outputs", "max_batch_size"})
    name = data["name"]
    if not isinstance(name, str) or not name.replace("_", "").replace("-", "").isalnum():
        raise SpecError(f"{path}.name", f"must be letters, digits, '_' or '-', got {name!r}")
    source = _choice(data, "source", path, "", tuple(ZOO))
    options = data.get("options", {})
    if not isinstance(options, dict):
        raise SpecError(f"{path}.options", "must be a mapping")
    zoo = ZOO[source]
    for key in options:
        if key not in zoo.build_options | zoo.input_options:
            allowed = ", ".join(sorted(zoo.build_options | zoo.input_options)) or "none"
            raise SpecError(f"{path}.options.{key}", f"unknown option for {source} (allowed: {allowed})")
    max_batch_size = _int(data, "max_batch_size", path, 0, 1)
    threads = _mapping(data.get("threads", {}), f"{path}.threads", {"intra_op", "inter_op"})
    precision = _choice(data, "precision", path, "fp32", ("fp32", "fp16"))
    inputs = _tensors(data["inputs"], f"{path}.inputs")
    outputs = _tensors(data["outputs"], f"{path}.outputs")
    for kind, tensors in (("inputs", inputs), ("outputs", outputs)):
        for i, tensor in enumerate(tensors):
            if tensor.dtype in ("fp32", "fp16") and tensor.dtype != precision:
                raise SpecError(
                    f"{path}.{kind}[{i}].dtype",
                    f"float tensors must match precision {precision}, got {tensor.dtype}",
                )
    for key in ("tensorrt_fp16", "warmup"):
        if not isinstance(data.get(key, False), bool):
            raise SpecError(f"{path}.{key}", "must be true or false")
    return ModelSpec(
        name=name,
        source=source,
        inputs=inputs,
        outputs=outputs,
        max_batch_size=max_batch_size,
        options=dict(options),
        seed=_int(data, "seed", path, 0, 0),
        precision=precision,
        batching=_batching(data.get("batching", {"mode": "dynamic"}), f"{path}.batching", max_batch_size),
        instances=_instances(data.get("instances", {}), f"{path}.instances"),
        target=_choice(data, "target", path, "auto", ("auto", "cpu", "gpu")),
        intra_op_threads=_int(threads, "intra_op", f"{path}.threads", 1, 0),
        inter_op_threads=_int(threads, "inter_op", f"{path}.threads", 1, 0),
        tensorrt_fp16=data.get("tensorrt_fp16", False),
        warmup=data.get("warmup", True),
    )


DEFAULT_STAGE_BATCHING = Batching(mode="dynamic", max_queue_delay_us=100)
PIPELINE_FIELDS = {
    "name",
    "model",
    "split",
    "stages",
    "cut_points",
    "balance",
    "replicas",
    "boundary_dtype",
    "batching",
    "live_updates",
}


def _positive_ints(data: dict[str, Any], key: str, path: str) -> tuple[int, ...]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value
    ):
        raise SpecError(f"{path}.{key}", f"must be a list of positive integers, got {value!r}")
    return tuple(value)


def parse_pipeline(data: Any, path: str, models: tuple[ModelSpec, ...]) -> PipelineSpec:
    """Parse one entry of ``pipelines``; ``models`` are the already parsed models it may split."""
    data = _mapping(data, path, PIPELINE_FIELDS, {"name", "model", "split"})
    name = data["name"]
    if not isinstance(name, str) or not name.replace("_", "").replace("-", "").isalnum():
        raise SpecError(f"{path}.name", f"must be letters, digits, '_' or '-', got {name!r}")
    by_name = {m.name: m for m in models}
    if data["model"] not in by_name:
        raise SpecError(
            f"{path}.model", f"must name an entry of models ({', '.join(by_name)}), got {data['model']!r}"
        )
    model = by_name[data["model"]]
    if model.precision != "fp32":
        raise SpecError(f"{path}.model", f"pipelines split fp32 models; {model.name} is {model.precision}")
    split = _choice(data, "split", path, "", ("blocks", "embedding_dense"))
    if split == "embedding_dense" and model.source != "recommender":
        raise SpecError(
            f"{path}.split", f"embedding_dense needs a recommender model, {model.name} is {model.source}"
        )
    cut_points = _positive_ints(data, "cut_points", path)
    stages = _int(data, "stages", path, len(cut_points) + 1 if cut_points else 2, 1)
    if split == "embedding_dense" and (stages != 2 or cut_points):
        raise SpecError(
            f"{path}.stages", "embedding_dense has exactly 2 stages (embedding, dense) and no cut_points"
        )
    if cut_points and (len(cut_points) != stages - 1 or list(cut_points) != sorted(set(cut_points))):
        raise SpecError(
            f"{path}.cut_points",
            f"must be {stages - 1} strictly increasing block indices, got {list(cut_points)}",
        )
    replicas = _positive_ints(data, "replicas", path)
    if replicas and len(replicas) != stages:
        raise SpecError(f"{path}.replicas", f"must list one count per stage ({stages}), got {list(replicas)}")
    live_updates = data.get("live_updates", False)
    if not isinstance(live_updates, bool):
        raise SpecError(f"{path}.live_updates", "must be true or false")
    if live_updates and split != "embedding_dense":
        raise SpecError(
            f"{path}.live_updates", "only the embedding stage of an embedding_dense split takes updates"
        )
    if live_updates and replicas and replicas[0] != 1:
        raise SpecError(
            f"{path}.replicas",
            "an updatable embedding stage runs one instance (each instance holds its own tables, so an "
            f"update would reach only one of them); got {replicas[0]}",
        )
    boundary_dtype = _choice(data, "boundary_dtype", path, "fp32", ("fp32", "fp16", "bf16"))
    if split == "embedding_dense" and boundary_dtype == "bf16":
        raise SpecError(
            f"{path}.boundary_dtype", "the dense stage reads numpy arrays, which have no bf16; use fp16"
        )
    # Every stage batches dynamically: the model's own batcher when it has one, else a short default.
    batching = model.batching if model.batching.mode == "dynamic" else DEFAULT_STAGE_BATCHING
    if "batching" in data:
        batching = _batching(data["batching"], f"{path}.batching", model.max_batch_size)
        if batching.mode != "dynamic":
            raise SpecError(f"{path}.batching.mode", f"every stage batches dynamically; got {batching.mode}")
    return PipelineSpec(
        name=name,
        model=model.name,
        split=split,
        stages=stages,
        cut_points=cut_points,
        balance=_choice(data, "balance", path, "latency", ("latency", "flops", "params")),
        replicas=replicas,
        boundary_dtype=boundary_dtype,
        batching=batching,
        live_updates=live_updates,
    )


def parse_spec(data: Any) -> Spec:
    """Parse the whole document (``{models: [...], pipelines: [...]}``), rejecting duplicate names."""
    data = _mapping(data, "spec", {"models", "pipelines", "text_embeddings"}, {"models"})
    if not isinstance(data["models"], list) or not data["models"]:
        raise SpecError("models", "must be a non-empty list")
    models = tuple(parse_model(item, f"models[{i}]") for i, item in enumerate(data["models"]))
    for i, model in enumerate(models):
        if model.name in [m.name for m in models[:i]]:
            raise SpecError(f"models[{i}].name", f"duplicate model name {model.name!r}")
    items = data.get("pipelines", [])
    if not isinstance(items, list):
        raise SpecError("pipelines", "must be a list")
    pipelines = tuple(parse_pipeline(item, f"pipelines[{i}]", models) for i, item in enumerate(items))
    taken = {m.name for m in models}
    for i, pipeline in enumerate(pipelines):
        clash = sorted(taken & set(pipeline.repository_names))
        if clash:
            raise SpecError(f"pipelines[{i}].name", f"{clash[0]!r} is already a model or pipeline name")
        taken.update(pipeline.repository_names)
    from exporters.text_spec import parse_text_embeddings  # imports this module's parsing helpers

    return Spec(models, pipelines, parse_text_embeddings(data.get("text_embeddings", []), taken))


def load_spec(path: str | Path) -> Spec:
    """Read and validate a ``models.yaml`` file."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as error:
        raise SpecError(str(path), f"cannot read spec: {error}") from error
    return parse_spec(data)
