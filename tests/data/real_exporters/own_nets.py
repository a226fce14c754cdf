"""A user's factory module (``source: {python: "own_nets:classifier", path: <this folder>}``), a model
without a batch axis (``total``), and two sample functions, one with the signature a sampler must have
and one without."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

FEATURES = 8


def classifier(classes: int = 3) -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, classes))


def sample(batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"features": rng.standard_normal((batch, FEATURES), dtype=np.float32)}


def sample_without_rng(batch: int) -> dict[str, np.ndarray]:
    return {"features": np.zeros((batch, FEATURES), np.float32)}


class Total(nn.Module):
    """The sum of the whole input: one number, whatever the batch."""

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return features.sum()


def total() -> nn.Module:
    return Total()
