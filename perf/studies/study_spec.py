"""What the studies serve, as pure data (profiles name it without torch); each batching mode of a family
serves the same ONNX graph (the zoo's two families are two regimes on purpose: docs/PERF.md)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporters.errors import SpecError
from exporters.resolve import resolve_model
from exporters.schema.bounded_yaml import load_spec_document
from exporters.schema.models import Batching, Spec, parse_spec
from exporters.schema.sections import Precision
from exporters.schema.text_embeddings import DEFAULT_BATCHING, DEFAULT_BUCKETS, TextEmbeddingSpec
from exporters.schema.typed import to_data
from perf.errors import OptionError
from perf.model.grid import MAX_BATCH

STATIC_BATCH = 32  # the article's static batch


@dataclass(frozen=True)
class Mode:
    key: str
    title: str
    batching: dict[str, Any]
    instances: int = 1
    collect: int = 1  # samples the client gathers into one request (static batching)

    @property
    def max_queue_delay_ms(self) -> float | None:
        return self.batching["max_queue_delay_us"] / 1000 if self.batching["mode"] == "dynamic" else None


def dynamic(delay_us: int, queue: dict[str, Any] | None = None) -> dict[str, Any]:
    """Dynamic batching with this delay; ``queue``: a ``default_queue_policy`` (the batching study's modes
    have none: on Triton 2.51 it stalls one instance ~500 ms now and then; the client bounds the queue)."""
    return {"mode": "dynamic", "max_queue_delay_us": delay_us, **({"queue": queue} if queue else {})}


MODES: dict[str, Mode] = {
    mode.key: mode
    for mode in (
        Mode("none", "no batching", {"mode": "none"}),
        Mode("static32", "static 32 (client-side)", {"mode": "static", "batch_size": STATIC_BATCH},
             collect=STATIC_BATCH),
        Mode("dyn1ms", "dynamic, 1 ms", dynamic(1_000)),
        Mode("dyn10ms", "dynamic, 10 ms", dynamic(10_000)),
        Mode("dyn50ms", "dynamic, 50 ms", dynamic(50_000)),
        Mode("dyn1ms_x2", "dynamic, 1 ms, 2 instances", dynamic(1_000), instances=2),
    )
}  # fmt: skip

FAMILIES: dict[str, dict[str, Any]] = {
    "recommender": {
        "source": "recommender",
        "options": {"top": [4096, 2048, 512]},
        "inputs": [{"name": "dense", "dtype": "fp32", "shape": [13]},
                   {"name": "sparse_ids", "dtype": "int64", "shape": [8]}],
        "outputs": [{"name": "probability", "dtype": "fp32", "shape": [1]}],
    },
    "image_classifier": {
        "source": "image_classifier",
        "options": {"width": 32, "num_classes": 10, "resolution": 64},
        "inputs": [{"name": "image", "dtype": "fp32", "shape": [3, 64, 64]}],
        "outputs": [{"name": "logits", "dtype": "fp32", "shape": [10]}],
    },
}  # fmt: skip

# What makes a model of the user's spec the same graph in every mode (the rest is the study's).
GRAPH_FIELDS = ("source", "options", "seed", "precision", "calibration", "inputs", "outputs", "sample",
                "lengths", "shapes", "buckets", "allow_non_finite")  # fmt: skip


def spec_families(spec_path: Path, names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Models of the user's spec (``make perf SPEC=… MODELS=…``) as study families: their graphs."""
    try:
        spec = parse_spec(load_spec_document(spec_path), Path(spec_path).resolve().parent)
    except SpecError as error:
        raise OptionError(f"--spec {spec_path}: {error}") from error
    have = [m.name for m in spec.models]
    if unknown := [name for name in names if name not in have]:
        raise OptionError(
            f"unknown models (--models): {', '.join(unknown)}; neither zoo families ({', '.join(FAMILIES)}) "
            f"nor models of --spec {spec_path} ({', '.join(have)})"
        )
    try:  # only these models' artifacts are read (a self-describing source's tensors)
        models = {name: resolve_model(spec.model(name), f"models[{have.index(name)}]") for name in names}
    except SpecError as error:
        raise OptionError(f"--models from --spec {spec_path}: {error}") from error
    return {
        name: {k: v for k, v in to_data(model).items() if k in GRAPH_FIELDS} for name, model in models.items()
    }


TRIVIAL = "trivial"
TRIVIAL_ENTRY: dict[str, Any] = {
    "name": TRIVIAL, "source": "trivial", "options": {"features": 16}, "max_batch_size": MAX_BATCH,
    "inputs": [{"name": "x", "dtype": "fp32", "shape": [16]}],
    "outputs": [{"name": "y", "dtype": "fp32", "shape": [16]}],
    "batching": {"mode": "dynamic", "max_queue_delay_us": 100},
}  # fmt: skip


def model_name(family: str, mode: str) -> str:
    return f"{family}_{mode}"


def family_entry(
    family: str, name: str, batching: dict[str, Any], instances: int = 1, seed: int = 0,
    table: Mapping[str, dict[str, Any]] = FAMILIES,
) -> dict[str, Any]:  # fmt: skip
    """One ``models`` entry of ``family`` with this batching and instances (``table``: the families)."""
    return {
        "name": name, "seed": seed, **table[family], "max_batch_size": MAX_BATCH, "batching": batching,
        "instances": {"cpu": instances}, "threads": {"intra_op": 1, "inter_op": 1}, "target": "cpu",
    }  # fmt: skip


def study_entries(
    families: list[str], modes: list[str], seed: int = 0, table: Mapping[str, dict[str, Any]] = FAMILIES
) -> list[dict[str, Any]]:
    """The spec document's ``models`` list (the report keeps it as the exact spec used)."""
    entries = [
        family_entry(family, model_name(family, key), MODES[key].batching, MODES[key].instances, seed, table)
        for family in families
        for key in modes
    ]
    return [*entries, TRIVIAL_ENTRY]


def study_spec(
    families: list[str], modes: list[str], seed: int = 0, table: Mapping[str, dict[str, Any]] = FAMILIES
) -> Spec:
    """The study's spec (``Profile`` has already checked the names)."""
    return parse_spec({"models": study_entries(families, modes, seed, table)})


# The pipeline study: each pipeline against a model; ``VARIANTS``: study-only pipelines beside the spec's.
@dataclass(frozen=True)
class Comparison:
    """A pipeline measured against ``model``; ``boundaries`` = stages − 1."""

    pipeline: str
    model: str
    boundaries: int
    role: str  # what the row shows: "pipeline …", "fp16 boundary", "replicas [1, 2]", ...
    goals: tuple[str, ...] = ()  # keys of ``perf.studies.goals.GOALS`` this row is judged by


VARIANTS: tuple[dict[str, Any], ...] = (
    {"name": "recommender_pipeline_fp16b", "model": "recommender", "split": "embedding_dense",
     "boundary_dtype": "fp16"},
    {"name": "image_classifier_pipeline_r12", "model": "image_classifier", "split": "blocks", "stages": 2,
     "replicas": [1, 2]},
    {"name": "image_classifier_torch", "model": "image_classifier", "split": "blocks", "stages": 1},
)  # fmt: skip

COMPARISONS: dict[str, Comparison] = {
    c.pipeline: c
    for c in (
        Comparison("recommender_pipeline", "recommender", 1, "pipeline (embedding | dense)",
                   ("pipeline saturation", "added p50 per boundary")),
        Comparison("recommender_pipeline_fp16b", "recommender", 1, "fp16 boundary"),
        Comparison("image_classifier_pipeline", "image_classifier", 1, "pipeline (2 stages, auto split)",
                   ("pipeline saturation",)),
        Comparison("image_classifier_pipeline_fp16", "image_classifier", 1, "fp16 boundary"),
        Comparison("image_classifier_pipeline_r12", "image_classifier", 1, "replicas [1, 2]"),
        Comparison("image_classifier_torch", "image_classifier", 0, "1 stage, same torch runner"),
    )
}  # fmt: skip
LIVE_PIPELINE = "recommender_pipeline"  # the one whose parameters the live phase updates while serving


# The text study: one encoder file served per batching mode; ``INT8``: ``buckets`` with the int8 encoder.
@dataclass(frozen=True)
class TextMode:
    name: str
    title: str
    buckets: tuple[int, ...]
    batching: Batching
    ragged: bool = False
    precision: Precision = "fp32"

    def spec(self) -> TextEmbeddingSpec:
        return TextEmbeddingSpec(
            name=f"text_{self.name}", buckets=self.buckets, batching=self.batching, precision=self.precision
        )


TEXT_MODES = {
    m.name: m
    for m in (
        TextMode("none", "no batching", (), Batching(mode="none")),
        TextMode("exact", "dynamic, exact lengths", (), DEFAULT_BATCHING),
        TextMode("buckets", "dynamic + length buckets", DEFAULT_BUCKETS, DEFAULT_BATCHING),
        TextMode("longest", "dynamic, padded to longest (ragged)", (), DEFAULT_BATCHING, ragged=True),
    )
}
INT8 = TextMode(
    "int8", "dynamic + length buckets, int8 encoder", DEFAULT_BUCKETS, DEFAULT_BATCHING, precision="int8"
)
TEXT_TITLES = {m.name: m.title for m in (*TEXT_MODES.values(), INT8)}
