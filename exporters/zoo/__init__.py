"""The project's model zoo: real torch models with seeded random weights, nothing downloaded.

Each entry knows how to build its model and how to make valid example inputs for it (ids inside the
embedding tables, images of the configured resolution), so exporters, clients and tests all draw
inputs the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from exporters.zoo.image_classifier import build_image_classifier
from exporters.zoo.recommender import Recommender, build_recommender
from exporters.zoo.trivial import build_trivial

SampleFn = Callable[[nn.Module, dict[str, Any], int, np.random.Generator], list[np.ndarray]]


@dataclass(frozen=True)
class ZooModel:
    """A buildable model: ``build(**options)`` and ``sample(model, options, batch, rng)``.

    ``sample`` returns one array per ``forward`` argument, in order, with the batch dimension first.
    ``build_options`` lists the options that shape the network (the rest, e.g. ``resolution``, only
    shape the inputs).
    """

    build: Callable[..., nn.Module]
    sample: SampleFn
    build_options: frozenset[str]
    input_options: frozenset[str] = frozenset()

    def create(self, options: dict[str, Any], seed: int) -> nn.Module:
        """Build with seeded weights: the same options and seed always give the same weights."""
        torch.manual_seed(seed)
        return self.build(**{k: v for k, v in options.items() if k in self.build_options})


def _sample_image(model: nn.Module, options: dict[str, Any], batch: int, rng: np.random.Generator):
    resolution = int(options.get("resolution", 64))
    return [rng.standard_normal((batch, 3, resolution, resolution), dtype=np.float32)]


def _sample_recommender(model: nn.Module, options: dict[str, Any], batch: int, rng: np.random.Generator):
    assert isinstance(model, Recommender)
    num_dense = int(options.get("num_dense", 13))
    dense = rng.standard_normal((batch, num_dense), dtype=np.float32)
    ids = np.stack([rng.integers(0, size, batch, dtype=np.int64) for size in model.table_sizes], axis=1)
    return [dense, ids]


def _sample_trivial(model: nn.Module, options: dict[str, Any], batch: int, rng: np.random.Generator):
    return [rng.standard_normal((batch, int(options.get("features", 16))), dtype=np.float32)]


ZOO: dict[str, ZooModel] = {
    "image_classifier": ZooModel(
        build_image_classifier, _sample_image, frozenset({"width", "num_classes"}), frozenset({"resolution"})
    ),
    "recommender": ZooModel(
        build_recommender,
        _sample_recommender,
        frozenset({"num_dense", "table_sizes", "embedding_dim", "bottom", "top"}),
    ),
    "trivial": ZooModel(build_trivial, _sample_trivial, frozenset(), frozenset({"features"})),
}
