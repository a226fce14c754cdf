"""Own models as real exporters write them, without a server: tensor names with ``/``, ``:`` and ``.``,
``?`` dims, a model without a batch axis, a factory spec with a wrong dtype, a sampler with the wrong
signature, the ``max_shape`` guard.

The serving side (``make serve``, ``client infer --check``) is in
``tests/integration/test_real_exporter_models.py``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from exporters.configs.models import build_model_config
from exporters.errors import ExportCheckError, SpecError
from exporters.init.entry import init_entry
from exporters.onnx_export import export_onnx
from exporters.schema.sections import TensorSpec
from python_backend.batching import InvalidInputError, TensorInfo, shared_axes, with_value_guards
from server.fronts.allow_list import CarriedInput, Carrier, ModelSignature, check_allowed
from server.fronts.refusal import RequestRefusedError
from tests.unit.python_backend.request_checks import validate

DATA = Path(__file__).resolve().parents[3] / "data" / "real_exporters"
sys.path.insert(0, str(DATA))
from exported_files import INPUT, OUTPUT, paddle_like, without_batch_axis  # noqa: E402


def test_exporters_names_and_question_mark_dims_are_read_as_they_are(tmp_path: Path) -> None:
    """``x:0`` and ``save_infer_model/scale_0.tmp_1`` were refused as not identifier-like; ``?`` read
    as one axis name made batch, height and width one shared size the backend enforced."""
    path = paddle_like(tmp_path / "inference.onnx")
    spec = init_entry("onnx", str(path), max_length=64, max_batch_size=4)
    assert [(t.name, t.shape, t.max_shape) for t in spec.inputs] == [(INPUT, (3, -1, -1), (3, 64, 64))]
    assert [(t.name, t.shape) for t in spec.outputs] == [(OUTPUT, (4,))]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].shape == ["?", 3, "?", "?"]
    assert shared_axes(session.get_inputs()) == {}  # anonymous, not one axis
    assert export_onnx(spec, tmp_path / "repo").max_rel_error == 0


@pytest.mark.parametrize("name", ["", " x", "x\ty", "a" * 257])
def test_a_name_no_tool_could_show_is_refused_with_the_fix(name: str) -> None:
    with pytest.raises(SpecError, match=r"printable characters without surrounding spaces.*model file gives"):
        TensorSpec(name, "fp32", (1,))


def test_a_name_from_the_artifact_is_named_by_its_field(tmp_path: Path) -> None:
    path = paddle_like(tmp_path / "spaced.onnx", input_name="x ")
    with pytest.raises(
        SpecError, match=r"^--onnx .*spaced.onnx: inputs\[0\].name: must be 1 to 256 .*rename"
    ):
        init_entry("onnx", str(path), max_length=8)


def test_the_build_runs_a_file_as_the_backend_will(tmp_path: Path) -> None:
    """A file that names height and width alike makes the backend hold them equal; a spec whose bounds
    differ (64 × 32) would then fail its own warm-up at load. The build's check reads the axes the
    backend's way, so the file fails there, with the fix."""
    path = paddle_like(tmp_path / "square.onnx", height="side", width="side")
    spec = init_entry("onnx", str(path), max_length=64, max_batch_size=4)
    (image,) = spec.inputs
    oblong = dataclasses.replace(spec, inputs=(dataclasses.replace(image, max_shape=(3, 64, 32)),))
    with pytest.raises(ExportCheckError, match=r"inputs must agree on axis 'side'.*rename the axes"):
        export_onnx(oblong, tmp_path / "repo")
    assert not (tmp_path / "repo" / "model.onnx").exists()


def test_a_model_without_a_batch_axis_is_named_plainly(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"the model has no batch axis: output 'y' is \[\] \(a scalar\)"):
        init_entry("onnx", str(without_batch_axis(tmp_path / "sum.onnx")), max_length=8)
    with pytest.raises(SpecError, match=r"--python own_nets:total: the model has no batch axis"):
        init_entry("python", "own_nets:total", path=str(DATA), sample="own_nets:sample")
    with pytest.raises(SpecError, match=r"shape: is \[\] .*give \[batch, 1\] .*write shape: \[1\]"):
        TensorSpec("y", "fp32", ())  # a spec written by hand: refused when validated, not at build


def test_a_wrong_dtype_in_a_factory_spec_is_one_line_naming_the_field(tmp_path: Path) -> None:
    spec = init_entry("python", "own_nets:classifier", path=str(DATA), sample="own_nets:sample")
    (features,) = spec.inputs
    wrong = dataclasses.replace(
        spec, sample=None, inputs=(dataclasses.replace(features, dtype="int64", range=(0, 10)),)
    )
    with pytest.raises(SpecError) as raised:
        export_onnx(wrong, tmp_path)
    message = str(raised.value)
    assert message.startswith("classifier.inputs[0].dtype: the model's forward fails"), message
    assert "features: int64 [2, 8]" in message and "weights are float32" in message
    assert "give each input the dtype" in message and "\n" not in message
    wrong_output = dataclasses.replace(spec, outputs=(dataclasses.replace(spec.outputs[0], dtype="int64"),))
    with pytest.raises(SpecError, match=r"outputs\[0\].dtype: is int64, the model gives float32.*fp32"):
        export_onnx(wrong_output, tmp_path)


def test_a_sampler_with_the_wrong_signature_is_one_line() -> None:
    with pytest.raises(SpecError) as raised:
        init_entry("python", "own_nets:classifier", path=str(DATA), sample="own_nets:sample_without_rng")
    message = str(raised.value)
    assert message.startswith("--sample: own_nets:sample_without_rng(batch) cannot be called as "), message
    assert "def sample_without_rng(batch: int, rng: numpy.random.Generator)" in message


def test_max_shape_travels_in_the_config_and_the_backend_refuses_beyond_it(tmp_path: Path) -> None:
    spec = init_entry("onnx", str(paddle_like(tmp_path / "inference.onnx")), max_length=200)
    config = build_model_config(spec, num_gpus=0)
    entries = {"parameters": {k: {"string_value": v} for k, v in config.parameters.items()}}
    (guarded,) = with_value_guards([TensorInfo(INPUT, np.dtype(np.float32), (3, -1, -1))], entries)
    assert validate({INPUT: np.zeros((2, 3, 200, 48), np.float32)}, [guarded]) == 2
    with pytest.raises(
        InvalidInputError, match=r"input 'x:0' has shape \[1, 3, 300, 48\], beyond its max_shape"
    ):
        validate({INPUT: np.zeros((1, 3, 300, 48), np.float32)}, [guarded])
    unguarded = with_value_guards([TensorInfo(INPUT, np.dtype(np.float32), (3, -1, -1))], {})
    assert validate({INPUT: np.zeros((1, 3, 300, 48), np.float32)}, unguarded) == 1  # configs without it
    with pytest.raises(ValueError, match="input_max_shapes: 'x:0' \\[3\\] fits no input"):
        bad = {"parameters": {"input_max_shapes": {"string_value": '{"x:0": [3]}'}}}
        with_value_guards([TensorInfo(INPUT, np.dtype(np.float32), (3, -1, -1))], bad)


def _fits(model: ModelSignature, shape: tuple[int, ...]) -> None:
    carried = CarriedInput(INPUT, "FP32", shape, Carrier.BINARY, 4 * math.prod(shape))
    check_allowed(model, [carried], [])


def test_the_fronts_read_the_bound_from_the_served_config(tmp_path: Path) -> None:
    """Both fronts check declared shapes against the config Triton serves; the ``input_max_shapes``
    parameter in it bounds the ``-1`` dims there too, with the backend's message."""
    spec = init_entry("onnx", str(paddle_like(tmp_path / "inference.onnx")), max_length=200)
    parameters = {k: {"string_value": v} for k, v in build_model_config(spec, num_gpus=0).parameters.items()}
    served = {
        "max_batch_size": 16,
        "input": [{"name": INPUT, "data_type": "TYPE_FP32", "dims": ["3", "-1", "-1"]}],
        "parameters": parameters,
    }
    model = ModelSignature.from_config("paddle_cls", served, 64 << 20)
    _fits(model, (4, 3, 200, 17))
    with pytest.raises(
        RequestRefusedError, match=r"input 'x:0' has shape \[1, 3, 300, 17\], beyond its max_shape"
    ):
        _fits(model, (1, 3, 300, 17))
    unbounded = ModelSignature.from_config("paddle_cls", {**served, "parameters": {}}, 64 << 20)
    _fits(unbounded, (1, 3, 300, 17))  # a config without it: what fits in the front's limit


def test_transformers_loads_quietly() -> None:
    from transformers.utils import logging as transformers_logging

    from exporters.sources.huggingface import quiet_transformers

    transformers_logging.set_verbosity_warning()
    quiet_transformers()
    assert transformers_logging.get_verbosity() == logging.ERROR
