"""A torch model's fp32 answer, the truth every artifact and served answer is held to (a leaf, so every
checker computes it the same way)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


def widen(array: np.ndarray) -> np.ndarray:
    """fp16 arrays as fp32: references run in fp32 whatever the served precision."""
    return array.astype(np.float32) if array.dtype == np.float16 else array


def torch_reference(model: nn.Module, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Run the fp32 torch model (float inputs widened to fp32); the truth every artifact is held to."""
    tensors = [torch.from_numpy(widen(a)) for a in inputs]
    with torch.inference_mode():
        outputs = model(*tensors)
    outputs = outputs if isinstance(outputs, tuple | list) else (outputs,)
    return [o.float().numpy() for o in outputs]
