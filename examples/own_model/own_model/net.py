"""A small tagger over variable-length token ids plus dense features: the kind of model a team has.

``build`` is the factory the spec names (``source: {python: "own_model.net:build", path: ...}``); the
spec's ``options`` arrive as its keyword arguments. ``sample`` draws valid inputs (ids inside the
vocabulary, any length up to ``MAX_TOKENS``) for parity checks, warm-up and ``client infer --check``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

MAX_TOKENS = 32
FEATURES = 8


class TinyTagger(nn.Module):
    """Token embeddings, mean-pooled over the sequence, joined with dense features, then an MLP."""

    def __init__(self, vocab: int, width: int, classes: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.head = nn.Sequential(nn.Linear(width + FEATURES, width), nn.ReLU(), nn.Linear(width, classes))

    def forward(self, tokens: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        pooled = self.embed(tokens).mean(dim=1)
        return torch.softmax(self.head(torch.cat([pooled, features], dim=1)), dim=-1)


def build(vocab: int = 1000, width: int = 32, classes: int = 4) -> nn.Module:
    return TinyTagger(vocab, width, classes)


def sample(batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    length = int(rng.integers(1, MAX_TOKENS + 1))
    return {
        "tokens": rng.integers(0, 1000, (batch, length), dtype=np.int64),
        "features": rng.standard_normal((batch, FEATURES), dtype=np.float32),
    }
