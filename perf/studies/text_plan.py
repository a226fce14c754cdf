"""What the text-embedding study compares: one encoder file served as an ensemble per batching mode
(docs/TEXT.md), and ``INT8``, ``buckets`` with the int8 encoder. Pure data, so profiles can name modes
without torch."""

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
