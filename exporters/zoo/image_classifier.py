"""A ResNet-18-structured image classifier, written here so nothing is downloaded: ``width`` scales every
stage's channels (64 is the real one); an ``nn.Sequential`` of blocks, so a pipeline can cut it."""

from __future__ import annotations

import torch
from torch import nn


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection (ResNet v1 basic block)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False), nn.BatchNorm2d(out_channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


def build_image_classifier(width: int = 32, num_classes: int = 10) -> nn.Sequential:
    """Stem, four stages of two basic blocks, pooled linear head; batch-norm statistics non-trivial, so
    exported graphs fold real numbers."""
    stem = nn.Sequential(
        nn.Conv2d(3, width, 7, 2, 3, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
    )
    blocks: list[nn.Module] = [stem]
    channels = width
    for stage, multiplier in enumerate((1, 2, 4, 8)):
        out_channels = width * multiplier
        for index in range(2):
            stride = 2 if stage > 0 and index == 0 else 1
            blocks.append(BasicBlock(channels, out_channels, stride))
            channels = out_channels
    blocks.append(nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, num_classes)))
    model = nn.Sequential(*blocks)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            nn.init.uniform_(module.weight, 0.5, 1.5)
            nn.init.uniform_(module.bias, -0.1, 0.1)
            module.running_mean.uniform_(-0.1, 0.1)
            module.running_var.uniform_(0.5, 1.5)
    return model.eval()
