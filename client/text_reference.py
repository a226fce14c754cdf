"""What a text-embedding service should answer: sentence-transformers' own ``encode`` on the same
texts, so ``infer --check`` proves the whole chain (tokenizer, graph, pooling, normalisation)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from client.errors import ClientError
from client.infer import infer
from exporters.artifacts.parity import OutputCheck, check_outputs
from exporters.errors import SpecError
from exporters.resolve import load_spec
from exporters.schema.text_embeddings import TextEmbeddingSpec
from exporters.text.embedding import CHECK_TEXTS, model_folder


@cache
def sentence_transformer(package: str):  # -> sentence_transformers.SentenceTransformer
    """The package's model loaded by sentence-transformers from local files (no hub access)."""
    from sentence_transformers import SentenceTransformer

    from exporters.sources.huggingface import quiet_transformers

    quiet_transformers()
    return SentenceTransformer(str(model_folder(package)), device="cpu", local_files_only=True)


def expected_embeddings(package: str, texts: Sequence[str]) -> np.ndarray:
    return sentence_transformer(package).encode(list(texts), normalize_embeddings=True, batch_size=32)


def compare_embeddings(actual: np.ndarray, expected: np.ndarray, entry: TextEmbeddingSpec) -> OutputCheck:
    """The build's one check (``exporters.artifacts.parity``) at the entry's tolerance."""
    return check_outputs(expected, actual, entry.output_tolerance, entry.precision, "embedding")


def text_array(texts: Sequence[str]) -> np.ndarray:
    """The ``text`` input: BYTES ``[rows, 1]`` of UTF-8."""
    return np.array([[t.encode("utf-8")] for t in texts], dtype=np.object_)


def text_entry(spec_path: Path, model: str, texts_given: bool) -> TextEmbeddingSpec | None:
    """The ``text_embeddings`` entry serving ``model``; None for other models (``--text`` needs one)."""
    try:
        entry = next((t for t in load_spec(spec_path).text_embeddings if t.name == model), None)
    except SpecError as error:
        raise ClientError(str(error)) from error
    if entry is None and texts_given:
        raise ClientError(f"--text: {model!r} is not a text_embeddings entry of {spec_path}")
    return entry


def infer_text(
    client: Any, protocol: str, model: str, entry: TextEmbeddingSpec, texts: Sequence[str] | None, check: bool
) -> int:
    """Embed and print ``texts`` (default: the build's check corpus); with ``check``, exit status 1
    unless they match sentence-transformers'."""
    texts = list(texts or CHECK_TEXTS)
    embeddings = infer(client, protocol, model, {"text": text_array(texts)})["embedding"]
    for text, row in zip(texts, embeddings, strict=True):
        label = text if len(text) <= 40 else f"{text[:37]}..."
        print(f"{model} via {protocol}: {label!r} -> {np.array2string(row[:4], precision=4)}")
    if not check:
        return 0
    parity = compare_embeddings(embeddings, expected_embeddings(entry.package, texts), entry)
    problems = f" ({'; '.join(parity.problems)})" if parity.problems else ""
    print(
        f"{'match' if parity.ok else 'MISMATCH'} vs sentence-transformers encode(normalize_embeddings=True) "
        f"on {len(texts)} texts ({entry.precision}): {parity.summary()}{problems}",
        file=sys.stdout if parity.ok else sys.stderr,
    )
    return 0 if parity.ok else 1
