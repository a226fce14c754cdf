"""fp32 ONNX graphs to fp16 by onnxruntime's converter (maintained with the runtime that serves the
result); ops in the block list stay fp32 behind Casts, appended at the end, hence a topological sort."""

from __future__ import annotations

from collections.abc import Sequence

import onnx


def to_fp16(
    model: onnx.ModelProto, keep_io_types: bool = False, block: Sequence[str] | None = None
) -> onnx.ModelProto:
    """``model`` in fp16; with ``keep_io_types`` its inputs and outputs stay fp32 (cast inside)."""
    from onnxruntime.transformers.float16 import convert_float_to_float16
    from onnxruntime.transformers.onnx_model import OnnxModel

    converted = convert_float_to_float16(
        model, keep_io_types=keep_io_types, op_block_list=list(block) if block is not None else None
    )
    ordered = OnnxModel(converted)
    ordered.topological_sort()
    return ordered.model
