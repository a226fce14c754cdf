"""The one dtype table: spec name, Triton config type, numpy and torch names. Standard library only
(numpy and torch imported on use): it is copied beside the stage runner's ``model.py``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DType:
    key: str  # the spec's name: "fp32"
    triton: str  # model_config.proto's DataType: "TYPE_FP32"
    numpy: str | None  # numpy's name; None where numpy has no such type (bf16)
    torch: str  # the attribute of the ``torch`` module
    size: int  # bytes per element

    def numpy_dtype(self) -> Any:
        """``numpy.dtype`` of this type (numpy imported here, not at module import)."""
        import numpy as np

        if self.numpy is None:
            raise TypeError(f"numpy has no {self.key}; it exists only between torch pipeline stages")
        return np.dtype(self.numpy)

    def torch_dtype(self) -> Any:
        """``torch.dtype`` of this type (torch imported here, not at module import)."""
        import torch

        return getattr(torch, self.torch)


DTYPES: dict[str, DType] = {
    d.key: d
    for d in (
        DType("fp32", "TYPE_FP32", "float32", "float32", 4),
        DType("fp16", "TYPE_FP16", "float16", "float16", 2),
        DType("int64", "TYPE_INT64", "int64", "int64", 8),
        DType("int32", "TYPE_INT32", "int32", "int32", 4),
        # Only between pipeline stages (compressed boundaries): numpy, hence ONNX models, lack it.
        DType("bf16", "TYPE_BF16", None, "bfloat16", 2),
    )
}
MODEL_DTYPES = tuple(key for key, d in DTYPES.items() if d.numpy is not None)  # what a model may declare
INTEGER_DTYPES = tuple(key for key, d in DTYPES.items() if d.torch.startswith("int"))
BY_TRITON: dict[str, DType] = {d.triton: d for d in DTYPES.values()}
