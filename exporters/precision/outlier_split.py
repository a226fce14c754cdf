"""Keep a weighted ``MatMul``'s outlier input channels in fp32, so its int8 part quantizes the rest finely:
``x·W = (x·keep)·W + x[:, outliers]·W[outliers, :]`` (LLM.int8()'s decomposition, exact in fp32;
docs/SPEC.md); outliers are the channels whose calibration peak exceeds ``ratio`` times the median's."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper
from onnxruntime.transformers.onnx_model import OnnxModel

OUTLIER_RATIO = 3.0  # a channel whose largest magnitude is above 3× the median channel's is an outlier
MOST_OUTLIERS = 16  # at most this many channels per input stay fp32 (the fp32 product stays small)


def channel_peaks(
    model: onnx.ModelProto, tensors: Sequence[str], calibration: Iterable[Mapping[str, np.ndarray]]
) -> dict[str, np.ndarray]:
    """The largest magnitude each tensor's last-axis channel reaches over the calibration batches."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    known = {o.name for o in probe.graph.output}
    for name in tensors:
        if name not in known:
            probe.graph.output.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    peaks: dict[str, np.ndarray] = {}
    for feeds in calibration:
        for name, value in zip(tensors, session.run(list(tensors), dict(feeds)), strict=True):
            peak = np.abs(value).reshape(-1, value.shape[-1]).max(axis=0)
            peaks[name] = np.maximum(peaks[name], peak) if name in peaks else peak
    return peaks


def outlier_channels(peak: np.ndarray, ratio: float = OUTLIER_RATIO, most: int = MOST_OUTLIERS) -> np.ndarray:
    """Indices (ascending) of the at most ``most`` largest channels above ``ratio`` × the median."""
    largest = np.argsort(peak)[::-1][:most]
    return np.sort(largest[peak[largest] > ratio * np.median(peak)]).astype(np.int64)


def split_outlier_channels(
    model: onnx.ModelProto, nodes: Sequence[str], calibration: Iterable[Mapping[str, np.ndarray]]
) -> onnx.ModelProto:
    """``model`` with every node of ``nodes`` (a ``MatMul`` whose second input is an initializer) split
    into an inlier ``MatMul`` (its original name, still to be quantized) plus an fp32 one over the
    outlier channels of its input, summed. Nodes sharing an input share its split. Modified in place."""
    by_name = {node.name: node for node in model.graph.node}
    weights = {tensor.name: tensor for tensor in model.graph.initializer}
    inputs = sorted({by_name[name].input[0] for name in nodes})
    peaks = channel_peaks(model, inputs, calibration)
    for tensor in inputs:
        channels = outlier_channels(peaks[tensor])
        if channels.size == 0:
            continue
        keep = np.ones_like(peaks[tensor], dtype=np.float32)
        keep[channels] = 0.0
        inliers, outliers = f"{tensor}_inliers", f"{tensor}_outliers"
        model.graph.initializer.append(numpy_helper.from_array(keep, f"{tensor}_keep"))
        model.graph.initializer.append(numpy_helper.from_array(channels, f"{tensor}_outlier_ids"))
        model.graph.node.extend([
            helper.make_node("Mul", [tensor, f"{tensor}_keep"], [inliers], name=f"{tensor}_inlier_mul"),
            helper.make_node("Gather", [tensor, f"{tensor}_outlier_ids"], [outliers], axis=-1,
                             name=f"{tensor}_outlier_gather"),
        ])  # fmt: skip
        for node in (by_name[name] for name in nodes if by_name[name].input[0] == tensor):
            rows = f"{node.name}_outlier_rows"  # per node: a weight may serve several
            weight = numpy_helper.to_array(weights[node.input[1]])
            model.graph.initializer.append(numpy_helper.from_array(weight[channels], rows))
            result = node.output[0]
            parts = [f"{result}_inlier_part", f"{result}_outlier_part"]
            node.input[0], node.output[0] = inliers, parts[0]
            model.graph.node.append(
                helper.make_node("MatMul", [outliers, rows], [parts[1]], name=f"{node.name}_outliers")
            )
            model.graph.node.append(helper.make_node("Add", parts, [result], name=f"{node.name}_sum"))
    OnnxModel(model).topological_sort()  # the new nodes were appended: read them after their inputs
    return model
