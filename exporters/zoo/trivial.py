"""A model that does almost nothing: it measures the serving harness, not compute."""

from __future__ import annotations

import torch
from torch import nn


class Doubler(nn.Module):
    """``y = 2x``; served through the same backend as the real models to give the harness ceiling."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2.0


def build_trivial() -> Doubler:
    return Doubler().eval()
