"""precision: int8: a QDQ graph with fp32 inputs and outputs, calibrated, and held to the fp32 model by
the one parity check, which refuses a build that misses its tolerance."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import onnx
import pytest

from exporters.artifacts.parity import check_outputs
from exporters.artifacts.torch_reference import torch_reference
from exporters.configs.models import TENSORRT_INT8, build_model_config
from exporters.errors import ExportCheckError, SpecError
from exporters.onnx_export import export_onnx, run_onnx
from exporters.schema.models import ModelSpec, OnnxSource
from exporters.schema.sections import TensorSpec
from exporters.sources.inputs import draw_inputs
from exporters.sources.load import build_torch_model

INPUTS = (
    TensorSpec("dense", "fp32", (13,)),
    TensorSpec("sparse_ids", "int64", (8,), range=(0, 10)),  # the smallest table has 10 rows
)
OUTPUT = TensorSpec("probability", "fp32", (1,))


def _ops(path: Path) -> set[str]:
    return {node.op_type for node in onnx.load(str(path)).graph.node}


def test_zoo_int8_is_a_qdq_graph_with_fp32_io_within_its_defaults(model_spec, tmp_path: Path) -> None:
    spec = model_spec("recommender_int8")
    artifact = export_onnx(spec, tmp_path)
    assert {"QuantizeLinear", "DequantizeLinear"} <= _ops(artifact.path)
    graph = onnx.load(str(artifact.path)).graph
    assert [v.type.tensor_type.elem_type for v in graph.output] == [onnx.TensorProto.FLOAT]
    (record,) = artifact.outputs
    assert record["precision"] == "int8" and record["tolerance"]["max_rel"] == 0.1 and not record["problems"]
    assert 0 < record["max_rel_error"] <= 0.1  # quantized: not fp32's rounding, inside int8's limit
    # An independent draw the exporter never saw: still within int8's defaults.
    model = build_torch_model(spec)
    inputs = draw_inputs(spec, 32, seed=4321, model=model)
    check = check_outputs(
        torch_reference(model, inputs)[0], run_onnx(artifact.path, spec, inputs)[0], None, "int8"
    )
    assert check.ok, check.problems


def test_the_gate_refuses_int8_that_misses_the_spec_tolerance(model_spec, tmp_path: Path) -> None:
    tight = [{"name": "probability", "dtype": "fp32", "shape": [1], "tolerance": {"max_rel": 1e-3}}]
    with pytest.raises(ExportCheckError, match=r"probability: max relative error [0-9.e-]+ .* exceeds 0.001"):
        export_onnx(model_spec("recommender_int8", outputs=tight), tmp_path)
    assert not (tmp_path / "model.onnx").exists()


def test_own_onnx_file_builds_in_int8_and_a_calibration_function_is_used(
    model_spec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fp32 = export_onnx(model_spec("recommender"), tmp_path / "fp32")
    own = ModelSpec(
        name="own", source=OnnxSource(str(fp32.path)), max_batch_size=64, precision="int8",
        inputs=INPUTS, outputs=(OUTPUT,),
    )  # fmt: skip
    built = export_onnx(own, tmp_path / "int8")
    assert {"QuantizeLinear", "DequantizeLinear"} <= _ops(built.path) and not built.outputs[0]["problems"]
    # Calibrated on dense features 10^4 times larger than served: the activation ranges are useless, and
    # the gate says so with the figures.
    (tmp_path / "wide_calibration.py").write_text(
        "import numpy as np\n"
        "def draw(batch, rng):\n"
        "    return {'dense': 1e4 * rng.standard_normal((batch, 13)).astype(np.float32),\n"
        "            'sparse_ids': rng.integers(0, 10, (batch, 8))}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    wide = dataclasses.replace(own, calibration="wide_calibration:draw")
    try:
        with pytest.raises(ExportCheckError, match=r"own .* does not reproduce its fp32 source: probability"):
            export_onnx(wide, tmp_path / "wide")
    finally:
        sys.modules.pop("wide_calibration", None)


def test_int8_spec_rules_and_gpu_config(model_spec) -> None:
    with pytest.raises(SpecError, match="calibration: calibrates int8 quantization; precision is fp32"):
        model_spec("recommender", calibration="pkg.mod:draw")
    with pytest.raises(SpecError, match=r"inputs\[0\].dtype: float tensors of precision int8 are fp32"):
        model_spec("recommender_int8", inputs=[{"name": "dense", "dtype": "fp16", "shape": [13]}])
    spec = model_spec("recommender_int8", target="gpu")
    assert build_model_config(spec, num_gpus=1).gpu_execution_accelerator == [TENSORRT_INT8]
