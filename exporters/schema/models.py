"""The declarative spec (``models.yaml``): what to serve, where it comes from, how to batch and place it.
Each section is a frozen dataclass that is its own schema (``exporters.schema.typed``), so a typo is a
``SpecError`` naming the field path, never a silently different deployment; ``exporters.resolve`` fills
in the tensors a self-describing source leaves out."""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from exporters.errors import SpecError
from exporters.schema.bounded_yaml import check_expansion
from exporters.schema.guards import check_batch_bounds
from exporters.schema.sections import (
    INTEGER_DTYPES,
    MODEL_DTYPES,
    VARIABLE,
    Batching,
    Instances,
    Precision,
    Shapes,
    Target,
    TensorSpec,
    Threads,
    served_float,
)
from exporters.schema.text_embeddings import TextEmbeddingSpec
from exporters.schema.typed import Checked, at_least, check_fields, parse, to_data
from exporters.zoo import ZOO

SplitKind = Literal["blocks", "embedding_dense"]
Balance = Literal["latency", "flops", "params"]
BoundaryDtype = Literal["fp32", "fp16", "bf16"]
DEFAULT_BATCHING = Batching()  # frozen: one shared default is safe
DEFAULT_INSTANCES = Instances()
DEFAULT_THREADS = Threads()


def _check_name(name: str) -> None:
    if not name.replace("_", "").replace("-", "").isalnum():
        raise SpecError("name", f"must be letters, digits, '_' or '-', got {name!r}")


def _check_callable(key: str, location: str, what: str) -> None:
    """``location`` must name a callable as ``package.module:what``."""
    module, _, function = location.partition(":")
    if not function or not all(p.isidentifier() for p in [*module.split("."), function]):
        raise SpecError(key, f"must be 'package.module:{what}', got {location!r}")


@dataclass(frozen=True)
class PythonSource:
    """``source: {python: "pkg.module:factory", path: folder}``: the user's factory returning an
    ``nn.Module``, called with the spec's ``options``; ``path`` is put on ``sys.path`` to import it."""

    python: str
    path: str | None = None

    def __post_init__(self) -> None:
        check_fields(self)
        _check_callable("python", self.python, "factory")


@dataclass(frozen=True)
class OnnxSource(Checked):
    """``source: {onnx: path/model.onnx}``: an existing ONNX file, checked and copied in."""

    onnx: str


@dataclass(frozen=True)
class TorchExportSource(Checked):
    """``source: {torch_export: path/program.pt2}``: a ``torch.export`` program, opened in the sandbox."""

    torch_export: str


@dataclass(frozen=True)
class HuggingFaceSource(Checked):
    """``source: {huggingface: folder or package}``: a transformers model loaded offline, from a local
    folder or an installed package that carries its weights (``get_model_path()``)."""

    huggingface: str


Source = str | PythonSource | OnnxSource | TorchExportSource | HuggingFaceSource
# Sources whose artifact states its own signature: their inputs/outputs may be left out of the spec.
SELF_DESCRIBING = ("onnx", "torch_export")


@dataclass(frozen=True)
class ModelSpec:
    """One model of the repository: ``source`` is a zoo entry's name (seeded random weights) or a mapping
    naming the user's own model; ``inputs``/``outputs`` the served signature (no batch axis). Example
    inputs come from ``sample`` (``function(batch, rng)``), else the zoo or the tensors themselves;
    ``calibration`` (int8 only) draws the batches activation ranges are calibrated on."""

    name: str
    source: Source
    max_batch_size: int = at_least(1)
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)
    seed: int = at_least(0, 0)
    precision: Precision = "fp32"
    batching: Batching = DEFAULT_BATCHING
    instances: Instances = DEFAULT_INSTANCES
    target: Target = "auto"
    threads: Threads = DEFAULT_THREADS
    tensorrt_fp16: bool = False
    warmup: bool = True
    allow_non_finite: bool = False  # float inputs may carry NaN/±Inf (rejected with a 400 otherwise)
    sample: str | None = None
    calibration: str | None = None
    lengths: tuple[int, ...] = at_least(1, ())
    shapes: Shapes | None = None  # the lengths requests take as served (perf, tune, plan)
    buckets: tuple[int, ...] = at_least(1, ())  # lengths perf pads requests up to (the smallest that fits)

    def __post_init__(self) -> None:
        check_fields(self)
        _check_name(self.name)
        self._check_source()
        self._check_tensors()
        check_batch_bounds(self.max_batch_size, [(t.dtype, t.largest) for t in (*self.inputs, *self.outputs)])
        self.batching.check_fits(self.max_batch_size)
        for key in ("sample", "calibration"):
            if getattr(self, key) is not None:
                _check_callable(key, getattr(self, key), "function")
        if self.calibration is not None and self.precision != "int8":
            raise SpecError("calibration", f"calibrates int8 quantization; precision is {self.precision}")

    def _check_source(self) -> None:
        if isinstance(self.source, str):
            if self.source not in ZOO:
                raise SpecError(
                    "source",
                    f"must be one of {', '.join(ZOO)} (the zoo), or a mapping "
                    "{python | onnx | torch_export | huggingface: ...}; "
                    f"got {self.source!r}",
                )
            zoo = ZOO[self.source]
            allowed = zoo.build_options | zoo.input_options
            for key, value in self.options.items():
                if key not in allowed:
                    names = ", ".join(sorted(allowed)) or "none"
                    raise SpecError(f"options.{key}", f"unknown option for {self.source} (allowed: {names})")
                values = value if isinstance(value, list) else [value]  # every zoo option is a size
                if not values or not all(type(v) is int and v >= 1 for v in values):
                    raise SpecError(
                        f"options.{key}", f"must be a positive integer or a list of them, got {value!r}"
                    )
        elif self.source_kind != "python" and self.options:
            raise SpecError("options", f"{self.source_kind} sources take no options (only zoo and python do)")
        # Options reach the content hash (as JSON) and the user's factory: bounded as expanded, also when
        # the spec was built from data that did not come through exporters.schema.bounded_yaml.
        check_expansion({"options": self.options})

    def _check_tensors(self) -> None:
        for kind in ("inputs", "outputs"):
            tensors: tuple[TensorSpec, ...] = getattr(self, kind)
            if not tensors and self.source_kind not in SELF_DESCRIBING:
                raise SpecError(kind, "is required")
            for index, tensor in enumerate(tensors):
                if tensor.dtype not in MODEL_DTYPES:
                    raise SpecError(f"{kind}[{index}].dtype", f"must be one of {', '.join(MODEL_DTYPES)}")
                if tensor.dtype in ("fp32", "fp16") and tensor.dtype != served_float(self.precision):
                    raise SpecError(
                        f"{kind}[{index}].dtype",
                        f"float tensors of precision {self.precision} are {served_float(self.precision)}, "
                        f"got {tensor.dtype}",
                    )
                if tensor.name in [t.name for t in tensors[:index]]:
                    raise SpecError(f"{kind}[{index}].name", f"duplicate tensor name {tensor.name!r}")
                if kind == "outputs" and tensor.range is not None:
                    raise SpecError(f"outputs[{index}].range", "ranges bound inputs only")
                if kind == "inputs" and tensor.tolerance is not None:
                    raise SpecError(f"inputs[{index}].tolerance", "tolerances are for outputs only")
                needs_range = kind == "inputs" and self.source_kind != "zoo" and self.sample is None
                if needs_range and tensor.dtype in INTEGER_DTYPES and tensor.range is None:
                    raise SpecError(
                        f"inputs[{index}].range",
                        f"integer inputs of a {self.source_kind} source need range: [lo, hi) (valid ids) "
                        "or a sample: function",
                    )
        largest = self.variable_bound
        for key in ("lengths", "shapes", "buckets"):
            if getattr(self, key) and not largest:
                raise SpecError(key, "is for variable axes (-1 in an input's shape); there are none")
        for key, values in (("lengths", self.lengths),
                            ("shapes.lengths", self.shapes.lengths if self.shapes else ()),
                            ("buckets", self.buckets)):  # fmt: skip
            for index, length in enumerate(values):
                if length > largest:
                    raise SpecError(f"{key}[{index}]", f"{length} exceeds every variable axis' max_shape")
        if list(self.buckets) != sorted(set(self.buckets)):
            raise SpecError("buckets", f"must be strictly increasing lengths, got {list(self.buckets)}")

    @property
    def source_kind(self) -> str:
        """``zoo``, ``python``, ``onnx``, ``torch_export`` or ``huggingface``."""
        return "zoo" if isinstance(self.source, str) else dataclasses.fields(self.source)[0].name

    @property
    def variable_bound(self) -> int:
        """The largest ``max_shape`` of any variable input axis (0: none)."""
        axes = [m for t in self.inputs for d, m in zip(t.shape, t.largest, strict=True) if d == VARIABLE]
        return max(axes, default=0)


@dataclass(frozen=True)
class PipelineSpec:
    """A model of ``models`` (``model``, which the pipeline must equal) served as an ensemble of stages
    on different devices: ``split: blocks`` cuts an ``nn.Sequential`` into contiguous stages,
    ``embedding_dense`` puts the recommender's tables and dense network apart (docs/SPEC.md)."""

    name: str
    model: str
    split: SplitKind
    stages: int = at_least(1, 2)
    cut_points: tuple[int, ...] = at_least(1, ())
    balance: Balance = "latency"
    replicas: tuple[int, ...] = at_least(1, ())
    boundary_dtype: BoundaryDtype = "fp32"
    batching: Batching = DEFAULT_BATCHING  # the first stage's; later stages wait at most 100 µs
    live_updates: bool = False
    gpus: tuple[int, ...] = at_least(0, ())  # the GPU of each stage (default: stage k on GPU k mod G)

    def __post_init__(self) -> None:
        check_fields(self)
        _check_name(self.name)
        if self.split == "embedding_dense" and (self.stages != 2 or self.cut_points):
            raise SpecError(
                "stages", "embedding_dense has exactly 2 stages (embedding, dense) and no cut_points"
            )
        cuts = list(self.cut_points)
        if cuts and (len(cuts) != self.stages - 1 or cuts != sorted(set(cuts))):
            raise SpecError(
                "cut_points", f"must be {self.stages - 1} strictly increasing block indices, got {cuts}"
            )
        for key, each in (("replicas", "count"), ("gpus", "GPU")):
            if getattr(self, key) and len(getattr(self, key)) != self.stages:
                raise SpecError(
                    key, f"must list one {each} per stage ({self.stages}), got {list(getattr(self, key))}"
                )
        if self.live_updates and self.split != "embedding_dense":
            raise SpecError(
                "live_updates", "only the embedding stage of an embedding_dense split takes updates"
            )
        if self.live_updates and self.replicas and self.replicas[0] != 1:
            raise SpecError(
                "replicas",
                "an updatable embedding stage runs one instance (each instance holds its own tables, so an "
                f"update would reach only one of them); got {self.replicas[0]}",
            )
        if self.split == "embedding_dense" and self.boundary_dtype == "bf16":
            raise SpecError(
                "boundary_dtype", "the dense stage reads numpy arrays, which have no bf16; use fp16"
            )
        if self.batching.mode != "dynamic":
            raise SpecError("batching.mode", f"every stage batches dynamically; got {self.batching.mode}")

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
    """The whole document; every name in the repository is unique."""

    models: tuple[ModelSpec, ...]
    pipelines: tuple[PipelineSpec, ...] = ()
    text_embeddings: tuple[TextEmbeddingSpec, ...] = ()

    def __post_init__(self) -> None:
        check_fields(self)
        if not self.models:
            raise SpecError("models", "must be a non-empty list")
        for i, model in enumerate(self.models):
            if model.name in [m.name for m in self.models[:i]]:
                raise SpecError(f"models[{i}].name", f"duplicate model name {model.name!r}")
        taken = {m.name for m in self.models}
        for key, entries in (("pipelines", self.pipelines), ("text_embeddings", self.text_embeddings)):
            for i, entry in enumerate(entries):
                clash = sorted(taken & set(entry.repository_names))
                if clash:
                    raise SpecError(f"{key}[{i}].name", f"{clash[0]!r} is already a model or pipeline name")
                taken.update(entry.repository_names)

    def model(self, name: str) -> ModelSpec:
        return _named(self.models, name, "model")

    def pipeline(self, name: str) -> PipelineSpec:
        return _named(self.pipelines, name, "pipeline")


def _named(entries: tuple[Any, ...], name: str, kind: str) -> Any:
    for entry in entries:
        if entry.name == name:
            return entry
    raise SpecError(f"{kind}s", f"no {kind} named {name!r} (have {[e.name for e in entries]})")


def resolved(source: Any, base_dir: Path | None) -> Any:
    """``source`` with its path made absolute from ``base_dir`` (the spec's folder); a Hugging Face
    location that is no folder there names an installed package and stays as it is."""
    key = "path" if isinstance(source, PythonSource) else dataclasses.fields(source)[0].name
    location = getattr(source, key)
    if location is None:
        return source
    absolute = str(Path(base_dir or "", location).resolve())
    if isinstance(source, HuggingFaceSource) and not Path(absolute).is_dir():
        return source
    return dataclasses.replace(source, **{key: absolute})


def parse_model(data: Any, path: str, base_dir: Path | None = None) -> ModelSpec:
    """Parse one entry of ``models``; paths in ``source`` are relative to ``base_dir`` (the spec's folder)."""
    spec = parse(ModelSpec, data, path)
    if not isinstance(spec.source, str):
        spec = dataclasses.replace(spec, source=resolved(spec.source, base_dir))
    return spec


MODULE_KINDS = ("zoo", "python", "huggingface")  # the sources that give a torch module in this process


def no_torch_module(kind: str) -> str:
    """Why a source of ``kind`` (``onnx``, ``torch_export``) gives no torch module to split or profile."""
    if kind == "torch_export":
        return (
            "a torch_export source is an archive from outside, opened only in the sandbox and served as the "
            "ONNX converted there, so this process has no torch module of it; to split it into a pipeline, "
            "use the python factory that made the program (source: {python: ...})"
        )
    return f"a {kind} source has no torch module (only zoo, python and huggingface sources do)"


DEFAULT_STAGE_BATCHING = Batching(mode="dynamic", max_queue_delay_us=100)


def parse_pipeline(data: Any, path: str, models: tuple[ModelSpec, ...]) -> PipelineSpec:
    """Parse one entry of ``pipelines``; ``models`` are the already parsed models it may split."""
    if isinstance(data, dict) and "model" in data:
        by_name = {m.name: m for m in models}
        if not isinstance(data["model"], str) or data["model"] not in by_name:
            raise SpecError(
                f"{path}.model", f"must name an entry of models ({', '.join(by_name)}), got {data['model']!r}"
            )
        model = by_name[data["model"]]
        if model.precision != "fp32":
            raise SpecError(
                f"{path}.model", f"pipelines split fp32 models; {model.name} is {model.precision}"
            )
        if model.source_kind not in MODULE_KINDS:
            raise SpecError(f"{path}.model", f"pipelines cut a torch module into stages; {model.name}: "
                            f"{no_torch_module(model.source_kind)}")  # fmt: skip
        if data.get("split") == "embedding_dense" and model.source != "recommender":
            raise SpecError(
                f"{path}.split", f"embedding_dense needs a recommender model, {model.name} is {model.source}"
            )
        # Every stage batches dynamically: the model's own batcher when it has one, else a short default.
        batching = model.batching if model.batching.mode == "dynamic" else DEFAULT_STAGE_BATCHING
        cut_points = data.get("cut_points")
        stages = len(cut_points) + 1 if isinstance(cut_points, list) and cut_points else 2
        return parse(PipelineSpec, data, path, batching=batching, stages=stages)
    return parse(PipelineSpec, data, path)


def with_absolute_paths(data: Any, base_dir: Path) -> Any:
    """The spec document with every path of a model's ``source`` absolute, so a copy written elsewhere
    (the tuner's ``spec.tuned.yaml``) builds the same models; entries that do not parse stay as they are."""
    if not isinstance(data, dict) or not isinstance(data.get("models"), list):
        return data
    models = []
    for index, entry in enumerate(data["models"]):
        if isinstance(entry, dict) and isinstance(entry.get("source"), dict):
            with contextlib.suppress(SpecError):
                entry = {**entry, "source": to_data(parse_model(entry, f"models[{index}]", base_dir).source)}
        models.append(entry)
    return {**data, "models": models}


def parse_spec(data: Any, base_dir: Path | None = None) -> Spec:
    """Parse the whole document (``{models: [...], pipelines: [...]}``), rejecting duplicate names."""
    if not isinstance(data, dict):
        raise SpecError("spec", f"must be a mapping, got {type(data).__name__}")
    unknown = sorted(set(data) - {f.name for f in dataclasses.fields(Spec)})
    if unknown:
        raise SpecError(unknown[0], "unknown field (allowed: models, pipelines, text_embeddings)")
    if not isinstance(data.get("models"), list) or not data["models"]:
        raise SpecError("models", "must be a non-empty list")
    models = tuple(parse_model(item, f"models[{i}]", base_dir) for i, item in enumerate(data["models"]))
    lists = {key: data.get(key, []) for key in ("pipelines", "text_embeddings")}
    for key, items in lists.items():
        if not isinstance(items, list):
            raise SpecError(key, "must be a list")
    pipelines = (parse_pipeline(item, f"pipelines[{i}]", models) for i, item in enumerate(lists["pipelines"]))
    texts = (
        parse(TextEmbeddingSpec, item, f"text_embeddings[{i}]")
        for i, item in enumerate(lists["text_embeddings"])
    )
    return Spec(models, tuple(pipelines), tuple(texts))
