"""ONNX files shaped like real exporters' output, written with ``onnx.helper`` (no exporter needed).

* ``paddle_like``: what paddle2onnx writes for an image classifier: tensor names with ``/``, ``:`` and
  ``.`` (``x:0`` in, ``save_infer_model/scale_0.tmp_1`` out), every unknown size written ``?``
  (``[?, 3, ?, ?]``: batch, height and width need not agree), weights named like layers.
* ``without_batch_axis``: a model whose output is a scalar: no axis is the batch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

INPUT = "x:0"
OUTPUT = "save_infer_model/scale_0.tmp_1"
CLASSES = 4
IR_VERSION = 8  # onnxruntime here reads IR <= 10


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=IR_VERSION)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def paddle_like(path: Path, height: str = "?", width: str = "?", input_name: str = INPUT) -> Path:
    """Global average pooling over height and width, then a linear head: ``[?, 3, ?, ?] -> [?, 4]``
    (``height`` and ``width`` name those axes otherwise: one name for both says they are equal)."""
    weights = np.random.default_rng(0).standard_normal((3, CLASSES)).astype(np.float32)
    nodes = [
        helper.make_node("ReduceMean", [input_name], ["pool_0.tmp_0"], axes=[2, 3], keepdims=0),
        helper.make_node("MatMul", ["pool_0.tmp_0", "linear_0.w_0"], [OUTPUT]),
    ]
    graph = helper.make_graph(
        nodes, "paddle_like",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["?", 3, height, width])],
        [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["?", CLASSES])],
        [numpy_helper.from_array(weights, "linear_0.w_0")],
    )  # fmt: skip
    return _save(graph, path)


def without_batch_axis(path: Path) -> Path:
    """``x [n] -> y []``: the sum of a vector."""
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["y"], keepdims=0)], "without_batch_axis",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
    )  # fmt: skip
    return _save(graph, path)
