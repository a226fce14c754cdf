"""torch → ONNX: parity for fp32 and fp16, skipping work already done, and refusing unsafe files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from exporters.artifacts.onnx_files import check_external_data
from exporters.artifacts.parity import MAX_REL, compare_outputs
from exporters.artifacts.torch_reference import torch_reference
from exporters.errors import ExportCheckError, SpecError
from exporters.onnx_export import export_onnx, run_onnx
from exporters.sources.inputs import draw_inputs
from exporters.sources.load import build_torch_model


@pytest.mark.parametrize("name", ["recommender", "recommender_fp16", "image_classifier"])
def test_export_matches_torch(model_spec, tmp_path: Path, name: str) -> None:
    spec = model_spec(name)
    artifact = export_onnx(spec, tmp_path)
    assert artifact.max_rel_error <= MAX_REL[spec.precision]
    graph = onnx.load(str(artifact.path)).graph
    assert [i.name for i in graph.input] == [t.name for t in spec.inputs]
    assert [o.name for o in graph.output] == [t.name for t in spec.outputs]
    assert graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    # An independent draw at a batch size the exporter never checked.
    model = build_torch_model(spec)
    inputs = draw_inputs(spec, 7, seed=1234, model=model)
    compare_outputs(
        run_onnx(artifact.path, spec, inputs), torch_reference(model, inputs), spec.precision, name
    )


def test_fp16_file_is_half_and_differs_from_fp32(model_spec, tmp_path: Path) -> None:
    fp32 = export_onnx(model_spec("recommender"), tmp_path / "fp32")
    fp16 = export_onnx(model_spec("recommender_fp16"), tmp_path / "fp16")
    assert fp16.path.stat().st_size < 0.6 * fp32.path.stat().st_size
    assert fp16.max_abs_error > fp32.max_abs_error  # the rounding is real, and still inside tolerance


def test_second_export_is_skipped_by_content_hash(model_spec, tmp_path: Path) -> None:
    spec = model_spec("recommender")
    first = export_onnx(spec, tmp_path)
    stamp = first.path.stat().st_mtime_ns
    second = export_onnx(spec, tmp_path)
    assert second.cached and second.content_hash == first.content_hash
    assert first.path.stat().st_mtime_ns == stamp
    reseeded = export_onnx(model_spec("recommender", seed=1), tmp_path)
    assert not reseeded.cached and reseeded.content_hash != first.content_hash


def test_spec_that_does_not_match_the_model_is_rejected(model_spec, tmp_path: Path) -> None:
    spec = model_spec("recommender", outputs=[{"name": "probability", "dtype": "fp32", "shape": [2]}])
    with pytest.raises(SpecError, match=r"recommender.outputs\[0\].shape: is \[2\], the model gives \[1\]"):
        export_onnx(spec, tmp_path)
    assert not (tmp_path / "model.onnx").exists()


def test_parity_failure_names_the_model() -> None:
    expected = [np.linspace(0, 1, 10, dtype=np.float32)]
    with pytest.raises(
        ExportCheckError, match="my_model does not reproduce its fp32 source: output 0: max relative"
    ):
        compare_outputs([expected[0] + 0.01], expected, "fp32", "my_model")
    report = compare_outputs([expected[0] + 0.001], expected, "fp16", "my_model")
    assert report.max_abs_error == pytest.approx(0.001, rel=1e-3) == report.max_rel_error  # max|e| is 1
    assert report.tolerance == MAX_REL["fp16"]


def test_external_data_outside_the_model_folder_is_rejected(tmp_path: Path) -> None:
    tensor = onnx.helper.make_tensor("w", onnx.TensorProto.FLOAT, [1], [1.0])
    tensor.ClearField("float_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value="../../etc/passwd")
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["w"], ["y"])],
        "g",
        [],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
        [tensor],
    )
    path = tmp_path / "model.onnx"
    onnx.save(onnx.helper.make_model(graph), str(path))
    with pytest.raises(ExportCheckError, match="points outside the model folder"):
        check_external_data(path)
