"""What the text-embedding study compares: one encoder served in four batching configurations.

Pure data (no torch, no server), so profiles can name modes and the CLI can check them before anything
is built. Every mode is its own ensemble (``text_<mode>``: tokenizer → encoder) built from the same
encoder file, so modes differ only in padding and batching:

* ``none``: no batching; each request padded to its own length;
* ``exact``: dynamic batching on exact lengths: only requests of identical token length merge;
* ``buckets``: dynamic batching with length buckets (the shipped ``text_embedding``);
* ``longest``: ragged batching: any lengths merge and each formed batch is padded to its longest member
  (the encoder on the Python backend; the native onnxruntime backend would not pad).

``INT8`` is ``buckets`` with the int8 encoder: measured beside it (closed loop on the mixed corpus, and
raw onnxruntime at the same batch) for int8's speed against fp32, not as a batching mode of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporters.schema.models import Batching
from exporters.schema.sections import Precision
from exporters.schema.text_embeddings import DEFAULT_BATCHING, DEFAULT_BUCKETS, TextEmbeddingSpec


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


MODES = {
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
TITLES = {m.name: m.title for m in (*MODES.values(), INT8)}
