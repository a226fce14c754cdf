"""A small image classifier in plain torch, shaped like MobileNetV3: what a vision user brings when
torchvision cannot be installed next to the CPU torch (README, "Serve your own model").

Depthwise-separable inverted residual blocks with squeeze-and-excitation and hard-swish, then global
pooling and a linear head over ``classes``. ``build`` is the factory the spec names; its outputs are
class scores (``tolerance: {kind: class_scores}``: the served argmax must agree with torch's).
"""

from __future__ import annotations

from torch import Tensor, nn


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        hidden = max(8, channels // 4)
        self.gate = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Conv2d(channels, hidden, 1), nn.ReLU(),
            nn.Conv2d(hidden, channels, 1), nn.Hardsigmoid(),
        )  # fmt: skip

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gate(x)


class InvertedResidual(nn.Module):
    """Expand (1×1), depthwise 3×3, squeeze-excite, project (1×1); a skip where shapes allow."""

    def __init__(self, inputs: int, expanded: int, outputs: int, stride: int) -> None:
        super().__init__()
        self.skip = stride == 1 and inputs == outputs
        self.body = nn.Sequential(
            nn.Conv2d(inputs, expanded, 1, bias=False), nn.BatchNorm2d(expanded), nn.Hardswish(),
            nn.Conv2d(expanded, expanded, 3, stride, 1, groups=expanded, bias=False),
            nn.BatchNorm2d(expanded), nn.Hardswish(), SqueezeExcite(expanded),
            nn.Conv2d(expanded, outputs, 1, bias=False), nn.BatchNorm2d(outputs),
        )  # fmt: skip

    def forward(self, x: Tensor) -> Tensor:
        return x + self.body(x) if self.skip else self.body(x)


class SmallMobileNet(nn.Module):
    def __init__(self, classes: int, width: int) -> None:
        super().__init__()
        w = width
        self.features = nn.Sequential(
            nn.Conv2d(3, w, 3, 2, 1, bias=False), nn.BatchNorm2d(w), nn.Hardswish(),
            InvertedResidual(w, 4 * w, w, 1), InvertedResidual(w, 4 * w, 2 * w, 2),
            InvertedResidual(2 * w, 6 * w, 2 * w, 1), InvertedResidual(2 * w, 6 * w, 4 * w, 2),
            InvertedResidual(4 * w, 6 * w, 4 * w, 1),
        )  # fmt: skip
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * w, classes))

    def forward(self, image: Tensor) -> Tensor:
        return self.head(self.features(image))


def build(classes: int = 10, width: int = 16) -> nn.Module:
    return SmallMobileNet(classes, width)
