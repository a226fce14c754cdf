"""What the text-embedding study sends (a deterministic corpus of realistic lengths) and the in-process
references it is held to: raw onnxruntime, sentence-transformers, the latency per padded length."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from perf.measure.raw import measure_raw
from python_backend.onnxruntime.ort_session import open_session
from python_backend.text_tokenizer.tokens import TextTokenizer

# the corpus's vocabulary, the commonest English words first: data, one word a line
WORDS = Path(__file__).with_name("corpus_words.txt").read_text().split()
KINDS = {  # kind: (share of the corpus, fewest words, most words)
    "query": (0.6, 3, 10),
    "sentence": (0.25, 12, 30),
    "passage": (0.15, 90, 200),
}


@dataclass(frozen=True)
class CorpusText:
    text: str
    kind: str  # query | sentence | passage


def make_corpus(size: int, seed: int = 0) -> list[CorpusText]:
    """``size`` texts drawn with ``seed``: kinds by their share, lengths uniform within each kind."""
    rng = np.random.default_rng(seed)
    shares = np.array([share for share, _, _ in KINDS.values()])
    corpus = []
    for kind in rng.choice(list(KINDS), size=size, p=shares / shares.sum()):
        low, high = KINDS[kind][1:]
        words = rng.choice(WORDS, size=int(rng.integers(low, high + 1)))
        text = " ".join(words)
        corpus.append(CorpusText(text[0].upper() + text[1:] + ("?" if kind == "query" else "."), str(kind)))
    return corpus


def raw_onnxruntime(
    onnx_path: str, tokenizer: TextTokenizer, corpus: Sequence[CorpusText], batch: int
) -> tuple[float, float]:
    """(sentences/s, computed/real tokens) in-process, one thread, tokenization timed: texts grouped by
    padded length and run ``batch`` at a time, as the dynamic batcher groups them; best of two passes."""
    session = open_session(onnx_path, 1, 1, ["CPUExecutionProvider"])
    texts = [c.text for c in corpus]

    def one_pass() -> tuple[float, int, int]:
        start = time.perf_counter()
        encoded = tokenizer.tokenize([[t] for t in texts])
        by_width: dict[int, list] = {}
        for item in encoded:
            by_width.setdefault(item.input_ids.shape[1], []).append(item)
        real = computed = 0
        for items in by_width.values():
            for first in range(0, len(items), batch):
                group = items[first : first + batch]
                ids = np.concatenate([g.input_ids for g in group])
                mask = np.concatenate([g.attention_mask for g in group])
                session.run(["embedding"], {"input_ids": ids, "attention_mask": mask})
                real += sum(g.real_tokens for g in group)
                computed += ids.size
        return time.perf_counter() - start, real, computed

    session.run(
        ["embedding"], {"input_ids": np.ones((1, 8), np.int64), "attention_mask": np.ones((1, 8), np.int64)}
    )
    best, real, computed = min(one_pass() for _ in range(2))
    return len(texts) / best, computed / real


def sentence_transformers_rate(package: str, corpus: Sequence[CorpusText], batch: int = 32) -> float:
    """Sentences/s of ``SentenceTransformer.encode`` in-process, what a user runs instead."""
    from client.text_reference import sentence_transformer

    model = sentence_transformer(package)
    texts = [c.text for c in corpus]
    model.encode(texts[:batch], batch_size=batch, normalize_embeddings=True)
    start = time.perf_counter()
    model.encode(texts, batch_size=batch, normalize_embeddings=True)
    return len(texts) / (time.perf_counter() - start)


def bucket_latency(
    onnx_path: str, lengths: Sequence[int], batches: Sequence[int], seconds: float = 0.2
) -> dict[int, dict[int, float]]:
    """``{padded length: {batch: median ms}}`` in-process, timed as ``measure_raw`` times."""
    rng = np.random.default_rng(0)
    table: dict[int, dict[int, float]] = {}
    for length in lengths:
        shape = (max(batches), length)
        pool = {
            "input_ids": rng.integers(1000, 20000, size=shape, dtype=np.int64),
            "attention_mask": np.ones(shape, dtype=np.int64),
        }
        points = measure_raw(Path(onnx_path), pool, batches, seconds=seconds, repeats=3)
        table[length] = {point.batch: point.batch_ms for point in points}
    return table
