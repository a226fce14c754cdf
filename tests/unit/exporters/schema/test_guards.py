"""Input guards without a server: value checks in the batching core, the config parameters that carry
them, the HTTP front's request check, and the artifact file hash."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from exporters.artifacts.file_hash import file_matches, file_sha256
from exporters.configs.models import build_model_config
from exporters.schema.guards import guard_parameters
from exporters.schema.models import parse_spec
from exporters.text.configs import text_configs
from python_backend.batching import (
    InvalidInputError,
    TensorInfo,
    check_shared_axes,
    run_batched,
    shared_axes,
    validate,
    with_value_guards,
)
from server import ServerOptions
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


def test_launcher_hides_triton_behind_the_fronts(tmp_path: Path) -> None:
    options = ServerOptions(repository=tmp_path, http_front=True, grpc_front=True, workdir=tmp_path / "w")
    server = TritonServer(options)
    assert server.triton_http_port != server.http_port
    assert server.triton_http_url == f"127.0.0.1:{server.triton_http_port}"
    assert server.triton_grpc_url == f"127.0.0.1:{server.triton_grpc_port}" != server.grpc_url
    command = server.command()
    assert f"--grpc-port={server.triton_grpc_port}" in command and "--grpc-address=127.0.0.1" in command
    # Triton's own ports answer inference only to what the fronts pass on, and shared memory only to
    # the operator: the fronts serve it from their own table (Triton never maps a client's file)
    key = server.admin_key
    operator = f"model-repository,trace,logging,shared-memory:triton-admin-key={key}"
    for flag in ("--http-restricted-api", "--grpc-restricted-protocol"):
        assert f"{flag}=inference:triton-front-key={key}" in command
        assert f"{flag}={operator}" in command
    trusted = TritonServer(replace(options, trusted_shared_memory=True, workdir=tmp_path / "t"))
    assert f"--http-restricted-api=inference,shared-memory:triton-front-key={trusted.admin_key}" in (
        trusted.command()
    )
    # without fronts: an in-process server's client is its own process (trusted, open on loopback)...
    plain = TritonServer(ServerOptions(repository=tmp_path, workdir=tmp_path / "p"))
    assert plain.triton_http_url == plain.http_url and plain.triton_grpc_url == plain.grpc_url
    assert not any("shared-memory" in arg for arg in plain.command())
    # ...unless told otherwise (`python -m server start --no-http-front`, the container): the operator's
    keyed = TritonServer(
        ServerOptions(repository=tmp_path, workdir=tmp_path / "k", trusted_shared_memory=False)
    )
    restricted = f"model-repository,trace,logging,shared-memory:triton-admin-key={keyed.admin_key}"
    assert f"--http-restricted-api={restricted}" in keyed.command()


def test_file_hash_detects_a_changed_artifact(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(b"abc" * 1000)
    digest = file_sha256(path)
    assert file_matches(path, digest)
    path.write_bytes(b"abc" * 999)
    assert not file_matches(path, digest)
    assert not file_matches(path, None)
    assert not file_matches(tmp_path / "missing.onnx", digest)


def test_inputs_sharing_a_named_axis_must_agree() -> None:
    """The text encoder's ``input_ids`` and ``attention_mask`` share ONNX axis ``sequence``: a direct
    request with 2 ids and 3 mask values is the client's fault (onnxruntime alone: a 500)."""
    inputs = [SimpleNamespace(name=n, shape=["batch", "sequence"]) for n in ("input_ids", "attention_mask")]
    inputs.append(SimpleNamespace(name="dense", shape=["batch", 13]))
    axes = shared_axes(inputs)
    assert axes == {
        "batch": [("input_ids", 0), ("attention_mask", 0), ("dense", 0)],
        "sequence": [("input_ids", 1), ("attention_mask", 1)],
    }
    good = {"input_ids": np.zeros((1, 2)), "attention_mask": np.zeros((1, 2)), "dense": np.zeros((1, 13))}
    check_shared_axes(good, axes)
    with pytest.raises(
        InvalidInputError, match="agree on axis 'sequence': 'attention_mask' 3, 'input_ids' 2"
    ):
        check_shared_axes({**good, "attention_mask": np.zeros((1, 3))}, axes)


def test_the_encoder_holds_direct_requests_to_what_the_tokenizer_sends(spec_data) -> None:
    """An ensemble member is no way around the ensemble's checks: the encoder refuses what the tokenizer
    never sends (ids outside the vocabulary, a mask other than 0/1, more than max_seq_length tokens)."""
    spec = parse_spec(spec_data).text_embeddings[0]
    encoder = text_configs(spec, num_gpus=0, vocab_size=30522)[2].to_proto()
    ranges = json.loads(encoder.parameters["input_ranges"].string_value)
    assert ranges == {"input_ids": [0, 30522], "attention_mask": [0, 2]}
    longest = json.loads(encoder.parameters["input_max_shapes"].string_value)  # the fronts bound it too
    assert longest == {"input_ids": [spec.max_seq_length], "attention_mask": [spec.max_seq_length]}
    infos = [TensorInfo(n, np.dtype(np.int64), (-1,)) for n in ("input_ids", "attention_mask")]
    entries = {"parameters": {k: {"string_value": v.string_value} for k, v in encoder.parameters.items()}}
    guarded = with_value_guards(infos, entries)
    with pytest.raises(InvalidInputError, match=r"input 'input_ids' holds -5, outside its declared range"):
        validate({"input_ids": np.array([[-5, 1]]), "attention_mask": np.array([[1, 1]])}, guarded)
    with pytest.raises(InvalidInputError, match=r"input 'attention_mask' holds 7, outside"):
        validate({"input_ids": np.array([[5, 1]]), "attention_mask": np.array([[7, 1]])}, guarded)
