"""int8 for the text encoder: outlier channels split off in fp32 (exact before quantizing, and what makes
run-time quantization accurate on them), and the build's gate on the real encoder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from exporters.errors import ExportCheckError
from exporters.precision.int8 import to_int8_dynamic
from exporters.precision.outlier_split import outlier_channels, split_outlier_channels
from exporters.schema.sections import Tolerance
from exporters.schema.text_embeddings import DEFAULT_PACKAGE, TextEmbeddingSpec
from exporters.text.embedding import export_encoder, model_folder

WIDTH, OUT, LOUD = 64, 48, (5, 40)  # input channels, output channels, the channels made large


def two_matmuls() -> onnx.ModelProto:
    """x → MatMul(W1) and MatMul(W2) (one shared input, as query/key/value share theirs) → their sum."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.normal(size=(WIDTH, OUT)).astype(np.float32), f"w{i}") for i in (1, 2)
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["y1"], name="first"),
        helper.make_node("MatMul", ["x", "w2"], ["y2"], name="second"),
        helper.make_node("Add", ["y1", "y2"], ["y"], name="sum"),
    ]
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", "tokens", WIDTH])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", "tokens", OUT])
    graph = helper.make_graph(nodes, "two", [x], [y], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def activations(seed: int, batches: int = 4) -> list[dict[str, np.ndarray]]:
    """Ordinary values, and two channels 50× larger: the shape of a transformer's hidden state."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(batches):
        x = rng.normal(size=(4, 16, WIDTH)).astype(np.float32)
        x[..., list(LOUD)] *= 50.0
        out.append({"x": x})
    return out


def run(model: onnx.ModelProto | bytes, feeds: dict[str, np.ndarray]) -> np.ndarray:
    data = model if isinstance(model, bytes) else model.SerializeToString()
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(["y"], feeds)[0]


def test_outliers_are_the_channels_far_above_the_median_at_most_the_limit() -> None:
    peak = np.array([1.0, 1.2, 0.9, 10.0, 1.1, 4.0, 1.0, 30.0, 1.0])
    assert outlier_channels(peak).tolist() == [3, 5, 7]  # above 3 × the median (1.1)
    assert outlier_channels(peak, most=2).tolist() == [3, 7]  # the largest ones first
    assert outlier_channels(np.ones(8)).size == 0


def test_the_split_is_exact_in_fp32_and_moves_the_large_channels_out() -> None:
    model = two_matmuls()
    feeds = activations(seed=1)[0]
    expected = run(model, feeds)
    split = split_outlier_channels(model, ["first", "second"], activations(seed=2))
    onnx.checker.check_model(split, full_check=True)
    np.testing.assert_allclose(run(split, feeds), expected, rtol=1e-5, atol=1e-4)
    (ids,) = [t for t in split.graph.initializer if t.name == "x_outlier_ids"]
    assert numpy_helper.to_array(ids).tolist() == list(LOUD)
    ops = [n.op_type for n in split.graph.node]
    assert ops.count("Gather") == 1 and ops.count("MatMul") == 4  # the input's split is shared


def plain_dynamic(model: onnx.ModelProto, folder: Path) -> bytes:
    """ONNX Runtime's dynamic quantization as it comes: per-tensor activation scales (weights in the
    same 7 bits as ours, so that only the outlier split differs)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from exporters.precision.int8 import REDUCE_RANGE

    source, target = folder / "fp32.onnx", folder / "int8.onnx"
    onnx.save(model, str(source))
    quantize_dynamic(
        str(source), str(target), per_channel=True, reduce_range=REDUCE_RANGE, weight_type=QuantType.QInt8
    )
    return target.read_bytes()


def test_dynamic_int8_keeps_the_ordinary_channels_accurate_beside_large_ones(tmp_path: Path) -> None:
    model = two_matmuls()
    feeds = activations(seed=3)[0]
    expected = run(model, feeds)
    quiet = {"x": np.where(np.isin(np.arange(WIDTH), LOUD), 0.0, feeds["x"]).astype(np.float32)}
    scale = float(np.abs(run(model, quiet)).max())  # what the ordinary channels contribute

    def error(data: bytes) -> float:
        return float(np.abs(run(data, feeds) - expected).max()) / scale

    with_split = to_int8_dynamic(model.SerializeToString(), activations(seed=4))
    assert "MatMulInteger" in {n.op_type for n in onnx.load_from_string(with_split).graph.node}
    assert error(with_split) < 0.05 < error(plain_dynamic(model, tmp_path))


def test_the_text_int8_build_is_refused_below_its_tolerance_naming_the_figure(tmp_path: Path) -> None:
    strict = TextEmbeddingSpec(
        "strict", precision="int8", tolerance=Tolerance(kind="embedding", cosine=0.99999)
    )
    with pytest.raises(ExportCheckError, match=r"embedding: min cosine 0\.99[0-9]* is below 0\.99999"):
        export_encoder(strict, model_folder(DEFAULT_PACKAGE), tmp_path)
    assert not (tmp_path / "model.onnx").exists() and not (tmp_path / "export.json").exists()
