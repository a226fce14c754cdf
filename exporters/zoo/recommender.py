"""A DLRM-style recommender: embedding tables for sparse ids, MLPs for dense features, written as two
halves (``embed``, the memory-heavy lookups; ``dense``) so a pipeline can place them on different devices."""

from __future__ import annotations

import itertools

import torch
from torch import nn


def _mlp(sizes: list[int], final_activation: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for index, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(fan_in, fan_out))
        if index < len(sizes) - 2 or final_activation:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class EmbeddingTables(nn.Module):
    """One embedding table per sparse feature; input ``[B, T]`` int64 ids, output ``[B, T, D]``."""

    def __init__(self, table_sizes: list[int], embedding_dim: int) -> None:
        super().__init__()
        self.tables = nn.ModuleList(nn.Embedding(size, embedding_dim) for size in table_sizes)

    def forward(self, sparse_ids: torch.Tensor) -> torch.Tensor:
        return torch.stack([table(sparse_ids[:, i]) for i, table in enumerate(self.tables)], dim=1)


class DenseInteraction(nn.Module):
    """Bottom MLP on dense features, pairwise dot products with the embeddings, top MLP to a probability."""

    def __init__(
        self, num_dense: int, num_tables: int, embedding_dim: int, bottom: list[int], top: list[int]
    ):
        super().__init__()
        self.bottom = _mlp([num_dense, *bottom, embedding_dim], final_activation=True)
        vectors = num_tables + 1
        rows, cols = torch.triu_indices(vectors, vectors, offset=1)
        self.register_buffer("pair_rows", rows, persistent=False)
        self.register_buffer("pair_cols", cols, persistent=False)
        self.top = _mlp([embedding_dim + rows.numel(), *top, 1], final_activation=False)

    def forward(self, dense: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
        bottom = self.bottom(dense)
        vectors = torch.cat([bottom.unsqueeze(1), embeddings], dim=1)
        dots = torch.bmm(vectors, vectors.transpose(1, 2))[:, self.pair_rows, self.pair_cols]
        return torch.sigmoid(self.top(torch.cat([bottom, dots], dim=1)))


class Recommender(nn.Module):
    """``forward(dense [B, F] fp32, sparse_ids [B, T] int64) -> click probability [B, 1]``."""

    def __init__(
        self,
        num_dense: int = 13,
        table_sizes: list[int] | None = None,
        embedding_dim: int = 32,
        bottom: list[int] | None = None,
        top: list[int] | None = None,
    ) -> None:
        super().__init__()
        self.table_sizes = list(table_sizes or [10_000, 5_000, 2_000, 1_000, 500, 100, 50, 10])
        self.embed = EmbeddingTables(self.table_sizes, embedding_dim)
        self.dense = DenseInteraction(
            num_dense,
            len(self.table_sizes),
            embedding_dim,
            bottom or [512, 256],
            top or [1024, 1024, 512, 256],
        )

    def forward(self, dense: torch.Tensor, sparse_ids: torch.Tensor) -> torch.Tensor:
        return self.dense(dense, self.embed(sparse_ids))
