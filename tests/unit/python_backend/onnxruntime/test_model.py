"""The python-based ``onnxruntime`` backend's ``execute`` without a server: a real ONNX file in
onnxruntime, Triton's Python API faked (``fake_triton``). What a batch of requests gets back: in order,
a bad request failing alone with its own error, the others' outputs exact and handed over as views of
the one batch output, each request's inputs listed once, and metrics updated once per execute."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.unit.python_backend.fake_triton import FakeError, FakeRequest, forget_modules, load_model_module


def _write_model(folder: Path) -> None:
    """``y = x * ids`` over a shared ``batch`` axis: every row's answer depends on that row alone."""
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["ids"], ["ids_f"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["x", "ids_f"], ["y"]),
        ],
        "toy",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2]),
            helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 1]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(folder / "model.onnx"))


def _write_ragged_model(folder: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["tokens"], ["echo"])],
        "echo",
        [helper.make_tensor_value_info("tokens", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("echo", TensorProto.INT64, ["batch", "sequence"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(folder / "model.onnx"))


def _args(tmp_path: Path, config: dict) -> dict:
    return {
        "model_config": json.dumps(config),
        "model_repository": str(tmp_path),
        "model_version": "1",
        "model_instance_kind": "CPU",
        "model_instance_device_id": "0",
    }


@pytest.fixture()
def backend(monkeypatch: pytest.MonkeyPatch):
    before = set(sys.modules)
    yield load_model_module(monkeypatch, "onnxruntime")
    forget_modules(before)


@pytest.fixture()
def toy(backend, tmp_path: Path):
    (tmp_path / "1").mkdir()
    _write_model(tmp_path / "1")
    model = backend.TritonPythonModel()
    model.initialize(
        _args(
            tmp_path,
            {
                "name": "toy",
                "max_batch_size": 8,
                "input": [
                    {"name": "x", "data_type": "TYPE_FP32", "dims": ["2"]},
                    {"name": "ids", "data_type": "TYPE_INT64", "dims": ["1"]},
                ],
                "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": ["2"]}],
                "parameters": {"input_ranges": {"string_value": '{"ids": [0, 10]}'}},
            },
        )
    )
    return model


def _inputs(rows: int, start: float, ids: int = 3) -> dict[str, np.ndarray]:
    return {
        "x": np.arange(rows * 2, dtype=np.float32).reshape(rows, 2) + start,
        "ids": np.full((rows, 1), ids, np.int64),
    }


def test_a_bad_request_in_the_middle_fails_alone_and_the_others_are_exact(toy) -> None:
    nan = _inputs(1, 0)
    nan["x"][0, 1] = np.nan
    sent = [
        _inputs(2, 0),
        nan,
        _inputs(3, 10, ids=7),
        _inputs(1, 0, ids=12),
        {"x": _inputs(1, 0)["x"]},
        _inputs(1, 5),
    ]
    requests = [FakeRequest(inputs) for inputs in sent]
    responses = toy.execute(requests)
    assert len(responses) == len(requests)
    errors = {i: r.error for i, r in enumerate(responses) if r.error is not None}
    assert set(errors) == {1, 3, 4} and all(e.code == FakeError.INVALID_ARG for e in errors.values())
    assert "input 'x' holds 1 non-finite value(s)" in errors[1].message
    assert "input 'ids' holds 12, outside its declared range [0, 10)" in errors[3].message
    assert "input 'ids' is missing" in errors[4].message
    answered = [responses[i].outputs["y"] for i in (0, 2, 5)]
    for index, y in zip((0, 2, 5), answered, strict=True):
        np.testing.assert_array_equal(y, sent[index]["x"] * sent[index]["ids"])
        assert y.flags.c_contiguous
    assert len({id(y.base) for y in answered}) == 1 and answered[0].base is not None  # one batch output
    assert all(r.listings == 1 for r in requests)  # each request's inputs listed once


def test_a_single_request_is_answered_without_a_batch(toy) -> None:
    (response,) = toy.execute([FakeRequest(_inputs(4, 1, ids=2))])
    assert response.error is None
    np.testing.assert_array_equal(response.outputs["y"], _inputs(4, 1)["x"] * 2)


def test_ragged_requests_are_counted_once_per_execute(backend, tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    _write_ragged_model(tmp_path / "1")
    model = backend.TritonPythonModel()
    config = {
        "name": "echo",
        "max_batch_size": 8,
        "input": [{"name": "tokens", "data_type": "TYPE_INT64", "dims": ["-1"], "allow_ragged_batch": True}],
        "output": [{"name": "echo", "data_type": "TYPE_INT64", "dims": ["-1"]}],
    }
    model.initialize(_args(tmp_path, config))
    requests = [FakeRequest({"tokens": np.array([[1, 2, 3]])}), FakeRequest({"tokens": np.array([[4]])})]
    short, long = reversed(model.execute(requests))
    assert long.outputs["echo"].tolist() == [[1, 2, 3]] and short.outputs["echo"].tolist() == [[4, 0, 0]]
    assert model.elements.real.increments == [4] and model.elements.padded.increments == [6]
