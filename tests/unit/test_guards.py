"""Input guards without a server: value checks in the batching core, the config parameters that carry
them, the HTTP guard's request check, and the artifact file hash."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from exporters.configs import build_model_config
from exporters.file_hash import file_matches, file_sha256
from exporters.guards import guard_parameters
from python_backend.batching import InvalidInputError, TensorInfo, run_batched, validate, with_value_guards
from server import ServerOptions
from server.http_guard import BadRequestError, check_infer_body
from server.launcher import TritonServer

DENSE = TensorInfo("dense", np.dtype(np.float32), (3,), finite=True)
IDS = TensorInfo("ids", np.dtype(np.int64), (2,), bounds=(0, 10))


def test_non_finite_floats_and_ids_outside_the_range_are_named() -> None:
    good = {"dense": np.zeros((2, 3), np.float32), "ids": np.ones((2, 2), np.int64)}
    assert validate(good, [DENSE, IDS]) == 2
    with pytest.raises(InvalidInputError, match=r"input 'dense' holds 2 non-finite value\(s\)"):
        validate({**good, "dense": np.array([[np.nan, 0, np.inf], [0, 0, 0]], np.float32)}, [DENSE, IDS])
    with pytest.raises(
        InvalidInputError, match=r"input 'ids' holds -1, outside its declared range \[0, 10\)"
    ):
        validate({**good, "ids": np.array([[1, -1], [2, 3]])}, [DENSE, IDS])
    with pytest.raises(InvalidInputError, match=r"holds 10, outside"):
        validate({**good, "ids": np.array([[1, 10], [2, 3]])}, [DENSE, IDS])
    unguarded = TensorInfo("dense", np.dtype(np.float32), (3,))
    assert validate({"dense": np.full((1, 3), np.nan, np.float32)}, [unguarded]) == 1


def test_guards_work_on_torch_tensors_and_fail_only_the_culprit() -> None:
    info = TensorInfo("ids", torch.int64, (2,), bounds=(0, 10))
    requests = [{"ids": torch.ones(1, 2, dtype=torch.int64)}, {"ids": torch.tensor([[1, -3]])}]
    results = run_batched(requests, [info], lambda batch: {"out": batch["ids"] * 2}, concatenate=torch.cat)
    assert torch.equal(results[0]["out"], torch.full((1, 2), 2))
    assert isinstance(results[1], InvalidInputError) and "holds -3" in str(results[1])
    finite = TensorInfo("x", torch.float32, (1,), finite=True)
    with pytest.raises(InvalidInputError, match="non-finite"):
        validate({"x": torch.tensor([[float("inf")]])}, [finite])


def test_config_parameters_carry_the_guards(model_spec) -> None:
    config = build_model_config(model_spec("recommender"), num_gpus=0)
    assert config.parameters["allow_non_finite_inputs"] == "false"
    assert json.loads(config.parameters["input_ranges"]) == {"sparse_ids": [0, 10000]}
    entries = {"parameters": {k: {"string_value": v} for k, v in config.parameters.items()}}
    infos = [
        TensorInfo("dense", np.dtype(np.float32), (13,)),
        TensorInfo("sparse_ids", np.dtype(np.int64), (8,)),
    ]
    dense, ids = with_value_guards(infos, entries)
    assert dense.finite and dense.bounds is None and ids.bounds == (0, 10000)
    allowed = model_spec("recommender", allow_non_finite=True)
    assert build_model_config(allowed, 0).parameters["allow_non_finite_inputs"] == "true"
    assert [i.finite for i in with_value_guards(infos, {})] == [True, True]  # NaN rejected by default


def test_bad_guard_parameters_are_named() -> None:
    infos = [TensorInfo("x", np.dtype(np.int64), (1,))]
    params = guard_parameters({"y": (0, 1)}, allow_non_finite=False)
    entries = {"parameters": {k: {"string_value": v} for k, v in params.items()}}
    with pytest.raises(ValueError, match=r"input_ranges names no input of the model: \['y'\]"):
        with_value_guards(infos, entries)
    with pytest.raises(ValueError, match="allow_non_finite_inputs must be true or false"):
        with_value_guards(infos, {"parameters": {"allow_non_finite_inputs": {"string_value": "maybe"}}})


def _body(shape: list[int], parameters: dict | None = None) -> bytes:
    item = {"name": "dense", "shape": shape, "datatype": "FP32", "data": [0.5] * 13}
    if parameters:
        item["parameters"] = parameters
    return json.dumps({"inputs": [item]}).encode()


def test_http_guard_refuses_shapes_the_body_cannot_carry() -> None:
    check_infer_body(_body([1, 13]), None)
    with pytest.raises(BadRequestError, match=r"declares shape \[64, 1099511627776\]"):
        check_infer_body(_body([64, 2**40]), None)
    with pytest.raises(BadRequestError, match="non-negative integers"):
        check_infer_body(_body([-1, 13]), None)
    shm = {"shared_memory_region": "r", "shared_memory_byte_size": 4 * 64 * 13}
    check_infer_body(_body([64, 13], shm), None)  # carried by shared memory, not the body
    with pytest.raises(BadRequestError, match="carries only 3328 bytes"):
        check_infer_body(_body([64, 2**20], shm), None)
    header = _body([1, 13])
    check_infer_body(header + b"\0" * 52, str(len(header)))  # binary tensor data after the header
    with pytest.raises(BadRequestError, match="does not fit the body"):
        check_infer_body(header, str(len(header) + 1))
    with pytest.raises(BadRequestError, match="nests too deeply"):
        check_infer_body(b"[" * 100_000, None)
    with pytest.raises(BadRequestError, match="not valid JSON"):
        check_infer_body(b"hello", None)


def test_http_guard_refuses_non_strings_in_bytes_data() -> None:
    def body(data: list) -> bytes:
        text = {"name": "text", "shape": [2, 1], "datatype": "BYTES", "data": data}
        return json.dumps({"inputs": [text]}).encode()

    check_infer_body(body(["hello", "wörld"]), None)
    check_infer_body(body([["hello"], ["world"]]), None)  # nested rows are fine
    for bad, shown in (([42, "x"], "42"), ([["x"], [None]], "null"), (["x", {"a": 1}], '{"a": 1}')):
        message = f"input 'text': BYTES data must be JSON strings, got {shown}"
        with pytest.raises(BadRequestError, match=re.escape(message)):
            check_infer_body(body(bad), None)


def test_launcher_hides_triton_http_behind_the_guard(tmp_path: Path) -> None:
    server = TritonServer(ServerOptions(repository=tmp_path, http_guard=True, workdir=tmp_path / "w"))
    assert server.triton_http_port != server.http_port
    assert server.triton_http_url == f"127.0.0.1:{server.triton_http_port}"
    plain = TritonServer(ServerOptions(repository=tmp_path, workdir=tmp_path / "p"))
    assert plain.triton_http_url == plain.http_url


def test_file_hash_detects_a_changed_artifact(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(b"abc" * 1000)
    digest = file_sha256(path)
    assert file_matches(path, digest)
    path.write_bytes(b"abc" * 999)
    assert not file_matches(path, digest)
    assert not file_matches(path, None)
    assert not file_matches(tmp_path / "missing.onnx", digest)
