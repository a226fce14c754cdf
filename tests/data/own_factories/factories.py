"""Factories the tests name in specs (``source: {python: "factories:<name>", path: <this folder>}``):
models whose faults are real, not mocked.

* ``tiny_logits``: a classifier whose logits are ~1e-9, as random-init mobilenet_v3_small gives; in fp16
  every one of them underflows to 0, which a check with an absolute floor passes.
* ``slow``: a model whose batch takes ~100 ms or more on one core for real (a chain of wide matmuls
  per sample), for the tuner's slow-model path.
* ``sequence_gru``: a Conv1d+GRU over sequences of any length (``frames: [-1, FRAME_FEATURES]``), whose
  cost grows with the length; ``sequence_sample`` draws lengths 10-200 as its traffic does (perf's
  shapes as served). Its answer changes when a sequence is padded: no length buckets for it.
* ``masked_pool``: per-frame features averaged under a ``mask`` input, with ``masked_sample``: padding
  with the mask at 0 changes nothing, so length buckets are offered for it.
* ``tiny_unet``: a UNet-shaped image model that runs only at sides that are multiples of 32.
* ``single_sequence`` with ``one_sequence_sample``: the GRU written for one sequence, without a batch
  axis, and a sampler without one (``exporters init``'s errors).
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


FRAME_FEATURES = 16
SEQUENCE_LENGTHS = (10, 200)  # the lengths ``sequence_sample`` draws, both ends included


class SequenceGru(nn.Module):
    """Conv1d over time, then a GRU; the last hidden state is the output. Compute grows with length."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(FRAME_FEATURES, hidden, kernel_size=3, padding=1)
        self.gru = nn.GRU(hidden, hidden, batch_first=True)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        features = torch.relu(self.conv(frames.transpose(1, 2))).transpose(1, 2)
        _, state = self.gru(features)
        return state[0]


def sequence_gru(hidden: int = 32) -> nn.Module:
    return SequenceGru(hidden)


def sequence_sample(batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One length per call, uniform in ``SEQUENCE_LENGTHS``: a batch's rows share it (one tensor)."""
    length = int(rng.integers(SEQUENCE_LENGTHS[0], SEQUENCE_LENGTHS[1] + 1))
    return {"frames": rng.standard_normal((batch, length, FRAME_FEATURES), dtype=np.float32)}


class TinyUnet(nn.Module):
    """A UNet-shaped image model: ``levels`` halvings (max-pool) down, as many doublings back up, each
    added to the skip of its level. An image whose side is not a multiple of 2**levels comes back up
    one pixel short of its skip, and the add cannot broadcast (as in the PP-OCR detector): H and W
    must be multiples of 32 at 5 levels."""

    def __init__(self, channels: int, levels: int) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, channels, kernel_size=3, padding=1)
        self.down = nn.ModuleList(nn.Conv2d(channels, channels, 3, padding=1) for _ in range(levels))
        self.head = nn.Conv2d(channels, 1, kernel_size=1)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem(image))
        skips = []
        for conv in self.down:
            skips.append(x)
            x = torch.relu(conv(nn.functional.max_pool2d(x, 2)))
        for skip in reversed(skips):
            x = nn.functional.interpolate(x, scale_factor=2.0, mode="nearest") + skip
        return torch.sigmoid(self.head(x))


def tiny_unet(channels: int = 4, levels: int = 5) -> nn.Module:
    return TinyUnet(channels, levels)


class SingleSequence(nn.Module):
    """The Conv1d+GRU of ``SequenceGru`` written for one sequence ``[T, FRAME_FEATURES]``, without a batch
    axis: a batch ``[B, T, F]`` reaches the convolution with the wrong axis as channels and fails."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(FRAME_FEATURES, hidden, kernel_size=3, padding=1)
        self.gru = nn.GRU(hidden, hidden)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        features = torch.relu(self.conv(frames.transpose(0, 1))).transpose(0, 1)
        _, state = self.gru(features)
        return state[0]


def single_sequence(hidden: int = 32) -> nn.Module:
    return SingleSequence(hidden)


def one_sequence_sample(batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One sequence whatever ``batch`` asks: a sampler written for a model without a batch axis."""
    length = int(rng.integers(SEQUENCE_LENGTHS[0], SEQUENCE_LENGTHS[1] + 1))
    return {"frames": rng.standard_normal((length, FRAME_FEATURES), dtype=np.float32)}


class MaskedPool(nn.Module):
    """Per-frame features (a Conv1d of kernel 1) averaged over the frames its ``mask`` marks: frames
    padded with the mask at 0 leave the answer as it was, so length buckets suit it."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.frame = nn.Conv1d(FRAME_FEATURES, hidden, kernel_size=1)

    def forward(self, frames: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        features = torch.tanh(self.frame(frames.transpose(1, 2))).transpose(1, 2)
        weights = mask.unsqueeze(-1).to(features.dtype)
        return (features * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)


def masked_pool(hidden: int = 32) -> nn.Module:
    return MaskedPool(hidden)


def masked_sample(batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``sequence_sample``'s frames, and a mask of ones over them (a request is all real frames)."""
    frames = sequence_sample(batch, rng)["frames"]
    return {"frames": frames, "mask": np.ones(frames.shape[:2], dtype=np.int64)}
