"""Factories the tests name in specs (``source: {python: "factories:<name>", path: <this folder>}``):
models whose faults are real, not mocked.

* ``tiny_logits``: a classifier whose logits are ~1e-9, as random-init mobilenet_v3_small gives; in fp16
  every one of them underflows to 0, which a check with an absolute floor passes.
* ``slow``: a model whose batch takes ~100 ms or more on one core for real (a chain of wide matmuls
  per sample), for the tuner's slow-model path.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

FEATURES = 16


class TinyLogits(nn.Module):
    """A linear classifier scaled so every logit is around ``scale``."""

    def __init__(self, classes: int, scale: float) -> None:
        super().__init__()
        self.linear = nn.Linear(FEATURES, classes)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * self.scale


def tiny_logits(classes: int = 10, scale: float = 1e-9) -> nn.Module:
    return TinyLogits(classes, scale)


class Slow(nn.Module):
    """``layers`` rounds of a (rows × width) @ (width × width) product per sample: compute grows with
    the batch, ~2·rows·width²·layers flops per sample."""

    def __init__(self, width: int, layers: int) -> None:
        super().__init__()
        self.weights = nn.Parameter(torch.randn(layers, width, width) / width**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for weight in self.weights:
            x = torch.tanh(x @ weight)
        return x.mean(dim=1)


def slow(width: int = 512, layers: int = 24) -> nn.Module:
    return Slow(width, layers)


def sample(batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"x": rng.standard_normal((batch, FEATURES), dtype=np.float32)}
