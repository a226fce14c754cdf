"""fp32 ONNX graphs to int8, in one place: ONNX Runtime's quantization (docs/SPEC.md). ``to_int8``
(``models:`` entries) is static QDQ calibrated on real inputs, the format ONNX Runtime recommends on CPU
and TensorRT reads as explicit INT8; ``to_int8_dynamic`` (the text encoder, whose static QDQ stayed below
its cosine limit) quantizes activations at run time, its outlier channels kept fp32. Only
weight-carrying ops are quantized: products of two activations cost accuracy for little speed."""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import onnx

WEIGHTED_OPS = ("MatMul", "Gemm", "Conv")
# Weights in 7 bits: without VNNI, ONNX Runtime's uint8 × int8 kernels add pairs of products in int16,
# which saturates at full range; a model built on one host may be served on another.
REDUCE_RANGE = True


def weighted_nodes(model: onnx.ModelProto) -> list[str]:
    """Names of the nodes to quantize: weight-carrying ops whose weight is an initializer."""
    constants = {t.name for t in model.graph.initializer}
    return [
        node.name
        for node in model.graph.node
        if node.op_type in WEIGHTED_OPS and len(node.input) > 1 and node.input[1] in constants
    ]


def to_int8(data: bytes, calibration: Iterable[Mapping[str, np.ndarray]]) -> bytes:
    """``data`` (an fp32 ONNX file) as a QDQ int8 graph calibrated on ``calibration`` (feeds by name)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Feeds(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = (dict(batch) for batch in calibration)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)

    with tempfile.TemporaryDirectory(prefix="int8-") as folder:
        source, target = _prepared(data, Path(folder)), Path(folder) / "int8.onnx"
        nodes = weighted_nodes(onnx.load(str(source)))
        quantize_static(
            str(source), str(target), Feeds(), quant_format=QuantFormat.QDQ, per_channel=True,
            reduce_range=REDUCE_RANGE, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
            op_types_to_quantize=list(WEIGHTED_OPS), nodes_to_quantize=nodes,
            extra_options={"ActivationSymmetric": False, "WeightSymmetric": True},
        )  # fmt: skip
        return target.read_bytes()


def to_int8_dynamic(data: bytes, calibration: Iterable[Mapping[str, np.ndarray]]) -> bytes:
    """``data`` (an fp32 ONNX file) with its weighted ``MatMul``s in int8, activations quantized at run
    time, the outlier input channels ``calibration`` reveals kept in fp32 (not a QDQ graph)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from exporters.precision.outlier_split import split_outlier_channels

    with tempfile.TemporaryDirectory(prefix="int8-") as folder:
        source, target = _prepared(data, Path(folder)), Path(folder) / "int8.onnx"
        model = onnx.load(str(source))
        weighted = set(weighted_nodes(model))
        nodes = [node.name for node in model.graph.node if node.name in weighted and node.op_type == "MatMul"]
        onnx.save(split_outlier_channels(model, nodes, calibration), str(source))
        quantize_dynamic(
            str(source), str(target), per_channel=True, reduce_range=REDUCE_RANGE,
            weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"], nodes_to_quantize=nodes,
            extra_options={"MatMulConstBOnly": True},
        )  # fmt: skip
        return target.read_bytes()


def _prepared(data: bytes, folder: Path) -> Path:
    """``data`` through ONNX Runtime's pre-processing (the quantizers need shapes), saved in ``folder``."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    exported, source = folder / "export.onnx", folder / "fp32.onnx"
    exported.write_bytes(data)
    # Symbolic inference is skipped: it fails on a sequence axis that a Min() bounds, as in the text
    # encoder's position ids.
    quant_pre_process(str(exported), str(source), skip_symbolic_shape=True)
    model = onnx.load(str(source))
    seen: set[str] = set()
    for index, node in enumerate(model.graph.node):  # the quantizers select nodes by name
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{index}"
        seen.add(node.name)
    onnx.save(model, str(source))
    return source
