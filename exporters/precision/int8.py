"""fp32 ONNX graphs to int8, in one place: ONNX Runtime's static or dynamic quantization.

``to_int8`` (every ``models:`` entry) is static quantization calibrated on real inputs. The result is a
QDQ graph (QuantizeLinear/DequantizeLinear pairs around the quantized ops), the format ONNX Runtime
recommends on CPU and the one TensorRT reads as explicit INT8 precision on a GPU. Weights are int8 per
output channel; activations uint8 with ranges from the calibration batches (ONNX Runtime's U8S8
recommendation for x86; VNNI runs it natively). The graph's inputs and outputs stay fp32, so a client
sends what the fp32 model takes.

Only ops that carry weights are quantized (``MatMul`` and ``Gemm`` with a constant second operand,
``Conv``): their cost dominates and their weights quantize well per channel. Products of two
activations (attention scores) stay fp32: quantizing them too cost the text encoder most of its
accuracy for little speed (docs/SPEC.md). Whether the result is good enough is not decided here: the
exporter holds it to the fp32 source with the one parity check (``exporters.artifacts.parity``).

``to_int8_dynamic`` (the text encoder) quantizes activations at run time instead, after moving the
outlier channels of each ``MatMul`` input to fp32: static QDQ of all-MiniLM-L6-v2 stayed below the
cosine 0.99 its embedding is held to, whatever the calibration (docs/SPEC.md).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import onnx

WEIGHTED_OPS = ("MatMul", "Gemm", "Conv")
# Weights in 7 bits, not 8: on an x86 CPU without VNNI (AVX2, AVX-512 without VNNI) ONNX Runtime's
# uint8 × int8 kernels add pairs of products in int16 (``vpmaddubsw``), which saturates at full range:
# the MiniLM encoder fell from cosine 0.993 to 0.985 and a toy MatMul's error grew tenfold on such a
# host. A model is often built on one machine and served on another, so every build takes the range
# that is right on both; on VNNI hosts it costs a little accuracy, which the parity check holds.
REDUCE_RANGE = True


def weighted_nodes(model: onnx.ModelProto) -> list[str]:
    """Names of the nodes to quantize: weight-carrying ops whose weight is an initializer."""
    constants = {t.name for t in model.graph.initializer}
    return [
        node.name
        for node in model.graph.node
        if node.op_type in WEIGHTED_OPS and len(node.input) > 1 and node.input[1] in constants
    ]


def _named(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every node with a unique name (the quantizer selects nodes by name; exporters may leave some out)."""
    seen: set[str] = set()
    for index, node in enumerate(model.graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{index}"
        seen.add(node.name)
    return model


def to_int8(data: bytes, calibration: Iterable[Mapping[str, np.ndarray]]) -> bytes:
    """``data`` (an fp32 ONNX file) as a QDQ int8 graph calibrated on ``calibration`` (feeds by input
    name); the graph's inputs and outputs stay fp32."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Feeds(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter(calibration)

        def get_next(self) -> dict[str, np.ndarray] | None:
            batch = next(self.batches, None)
            return None if batch is None else dict(batch)

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
    time (ONNX Runtime's dynamic quantization, weights per output channel), the outlier input channels
    ``calibration`` reveals kept in fp32 (``exporters.precision.outlier_split``). For transformer
    encoders, where static QDQ's fixed activation ranges lose too much (docs/SPEC.md); not a QDQ graph,
    so TensorRT does not read it as INT8."""
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
    """``data`` through ONNX Runtime's pre-processing (shape inference, graph optimisation: the
    quantizers need the shapes), every node uniquely named, saved in ``folder``."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    exported, source = folder / "export.onnx", folder / "fp32.onnx"
    exported.write_bytes(data)
    # Symbolic inference is skipped: it fails on a sequence axis that a Min() bounds, as in the text
    # encoder's position ids.
    quant_pre_process(str(exported), str(source), skip_symbolic_shape=True)
    onnx.save(_named(onnx.load(str(source))), str(source))
    return source
