"""What a text-embedding service should answer (``client.text_reference``): embeddings go through the one
check, with their precision's defaults."""

from __future__ import annotations

import numpy as np
import pytest

from exporters.schema.sections import Tolerance


def _unit_rows(rows: int, seed: int) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((rows, 384)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_embeddings_go_through_the_one_check_with_their_precision_defaults() -> None:
    from client.text_reference import compare_embeddings
    from exporters.schema.text_embeddings import TextEmbeddingSpec

    expected = _unit_rows(6, seed=0)
    fp16, fp32 = TextEmbeddingSpec("t", precision="fp16"), TextEmbeddingSpec("t")
    assert compare_embeddings(expected.astype(np.float16).astype(np.float32), expected, fp16).ok
    # The direction is right (cosine 1.0) but every value doubled: max_rel catches what cosine cannot.
    doubled = compare_embeddings(expected * 2, expected, fp16)
    assert doubled.min_cosine == pytest.approx(1.0) and not doubled.ok
    assert "max relative error" in doubled.problems[0]
    # A small rotation of one row fails fp32's defaults and passes the looser tolerance a spec gives.
    nudged = expected.copy()
    nudged[0] = 0.99 * expected[0] + 0.01 * _unit_rows(1, seed=1)[0]
    assert not compare_embeddings(nudged, expected, fp32).ok
    tolerant = TextEmbeddingSpec("t", tolerance=Tolerance(kind="embedding", max_rel=0.1, cosine=0.999))
    assert compare_embeddings(nudged, expected, tolerant).ok
