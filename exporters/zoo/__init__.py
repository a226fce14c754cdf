"""The project's model zoo: real torch models with seeded random weights, nothing downloaded, each with
the sampler of its valid inputs (ids inside its tables, images of its resolution)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from exporters.zoo.image_classifier import build_image_classifier
from exporters.zoo.recommender import Recommender

SampleFn = Callable[[nn.Module, dict[str, Any], int, np.random.Generator], list[np.ndarray]]


@dataclass(frozen=True)
class ZooModel:
    """``build(**options)`` and ``sample(model, options, batch, rng)`` (one array per ``forward``
    argument); ``build_options`` shape the network, ``input_options`` only the inputs."""

    build: Callable[..., nn.Module]
    sample: SampleFn
    build_options: frozenset[str]
    input_options: frozenset[str] = frozenset()

    def create(self, options: dict[str, Any], seed: int) -> nn.Module:
        """Built with seeded weights: the same options and seed always give the same weights."""
        torch.manual_seed(seed)
        return self.build(**{k: v for k, v in options.items() if k in self.build_options}).eval()


def _sample_image(model: nn.Module, options: dict[str, Any], batch: int, rng: np.random.Generator):
    resolution = int(options.get("resolution", 64))
    return [rng.standard_normal((batch, 3, resolution, resolution), dtype=np.float32)]


def _sample_recommender(model: nn.Module, options: dict[str, Any], batch: int, rng: np.random.Generator):
    assert isinstance(model, Recommender)
    num_dense = int(options.get("num_dense", 13))
    dense = rng.standard_normal((batch, num_dense), dtype=np.float32)
    ids = np.stack([rng.integers(0, size, batch, dtype=np.int64) for size in model.table_sizes], axis=1)
    return [dense, ids]


class Doubler(nn.Module):
    """``y = 2x``: it measures the serving harness, not compute (the harness ceiling)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2.0


def _sample_trivial(model: nn.Module, options: dict[str, Any], batch: int, rng: np.random.Generator):
    return [rng.standard_normal((batch, int(options.get("features", 16))), dtype=np.float32)]


ZOO: dict[str, ZooModel] = {
    "image_classifier": ZooModel(
        build_image_classifier, _sample_image, frozenset({"width", "num_classes"}), frozenset({"resolution"})
    ),
    "recommender": ZooModel(
        Recommender,
        _sample_recommender,
        frozenset({"num_dense", "table_sizes", "embedding_dim", "bottom", "top"}),
    ),
    "trivial": ZooModel(Doubler, _sample_trivial, frozenset(), frozenset({"features"})),
}
