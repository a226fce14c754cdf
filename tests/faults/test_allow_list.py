"""Fault matrix rows 53–55, 61 and 76: a request reaches Triton only if its model's config accepts it, over
both protocols, for the plain ONNX models, the ensembles and the text encoder alike, whatever carries
its tensors, shared memory included.

Before: ``[0, 0]`` INT64 to ``text_embedding_encoder`` passed both fronts (0 elements, 0 bytes) and
Triton never answered it; ``[1, 0]`` was a 500 from onnxruntime; an encoder sequence longer than the
model was built for ran; a name the model lacks, or an output it lacks, reached Triton. Each case here
is sent as the protocol's binary form (HTTP: a JSON header and binary data; gRPC: raw contents), and
must come back at once as 400 / ``INVALID_ARGUMENT`` naming the input and what the config allows, in
Triton's words where Triton has some; an unknown model gets Triton's own 404 / ``NOT_FOUND``. The same
tensors in the client's own shared-memory region get the same refusals, before the front reads a byte
of the region (row 61).
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import pytest
from harness import PROTOCOLS, exchange, raw_request, url
from shm_harness import client_module
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from client.connection import connect
from server import TritonServer

pytestmark = pytest.mark.integration
ANSWER_GUARD_S = 60  # not a latency bound: how long a request may go unanswered before it counts as never
ENCODER = "text_embedding_encoder"
TOKENS = ("input_ids", "attention_mask")


@dataclass(frozen=True)
class Tensor:
    name: str
    datatype: str
    shape: list[int]
    data: bytes


@dataclass(frozen=True)
class Case:
    model: str
    inputs: list[Tensor]
    message: str
    outputs: list[str] = field(default_factory=list)
    status: tuple[int, str] = (400, "INVALID_ARGUMENT")
    grpc_message: str | None = None  # where the gRPC front names the carrier differently


def _floats(shape: list[int], dtype: type = np.float32) -> bytes:
    return np.ones(int(np.prod(shape)), dtype).tobytes()


def _x(shape: tuple[int, ...] = (1, 16), datatype: str = "FP32", extra: int = 0) -> Tensor:
    data = _floats(list(shape), np.float64 if datatype == "FP64" else np.float32)
    return Tensor("x", datatype, list(shape), data + b"\0" * extra if extra >= 0 else data[:extra])


def _tokens(shape: list[int]) -> list[Tensor]:
    return [Tensor(name, "INT64", shape, np.ones(int(np.prod(shape)), np.int64).tobytes()) for name in TOKENS]


def _outside(name: str, model: str, shape: str, allowed: str, why: str) -> str:
    where = f"input '{name}' for model '{model}' has shape {shape}"
    return f"{where}, outside what its config allows: {allowed} ({why})"


SHORT = "input 'x' declares shape [1, 16] (16 elements) but"
ZERO = "a dimension may be 0 only where the config's input_min_shapes says so"
CASES = {
    "zero_zero_to_the_encoder": Case(
        ENCODER,
        _tokens([0, 0]),
        _outside("input_ids", ENCODER, "[0,0]", "[1..32,1..16]", "a batch of at least 1"),
    ),
    "zero_length_to_the_encoder": Case(
        ENCODER, _tokens([1, 0]), _outside("input_ids", ENCODER, "[1,0]", "[1..32,1..16]", ZERO)
    ),
    "zero_batch_to_an_onnx_model": Case(
        "trivial", [_x([0, 16])], _outside("x", "trivial", "[0,16]", "[1..64,16]", "a batch of at least 1")
    ),
    "zero_batch_to_a_pipeline": Case(
        "recommender_pipeline",
        [Tensor("dense", "FP32", [0, 13], b""), Tensor("sparse_ids", "INT64", [0, 8], b"")],
        _outside("dense", "recommender_pipeline", "[0,13]", "[1..64,13]", "a batch of at least 1"),
    ),
    "a_sequence_past_the_encoders_max_shape": Case(
        ENCODER,
        _tokens([1, 17]),
        "input 'input_ids' has shape [1, 17], beyond its max_shape [batch, 16]; send at most that",
    ),
    "an_input_missing": Case(
        "recommender",
        [Tensor("dense", "FP32", [1, 13], _floats([1, 13]))],
        "expected 2 inputs but got 1 inputs for model 'recommender'. Got input(s) ['dense'], but missing "
        "required input(s) ['sparse_ids']. Please provide all required input(s).",
    ),
    "an_input_the_model_lacks": Case(
        "trivial",
        [_x(), Tensor("z", "FP32", [1, 16], _floats([1, 16]))],
        "unexpected inference input 'z' for model 'trivial'",
    ),
    "an_input_twice": Case("trivial", [_x(), _x()], "input 'x' already exists in request"),
    "a_wrong_datatype": Case(
        "trivial",
        [_x(datatype="FP64")],
        "inference input 'x' data-type is 'FP64', but model 'trivial' expects 'FP32'",
    ),
    "four_bytes_too_few": Case(
        "trivial",
        [_x(extra=-4)],
        f"{SHORT} its binary data carries only 60 bytes for it",
        grpc_message=f"{SHORT} its raw data carries only 60 bytes for it",
    ),
    "four_bytes_too_many": Case(
        "trivial",
        [_x(extra=4)],
        "input byte size mismatch for input 'x' for model 'trivial'. Expected 64, got 68",
    ),
    "a_batch_above_max_batch_size": Case(
        "trivial",
        [_x([65, 16])],
        "input 'x' declares a batch of 65: inference request batch-size must be <= 64 for 'trivial'",
    ),
    "an_output_the_model_lacks": Case(
        "trivial", [_x()], "unexpected inference output 'q' for model 'trivial'", outputs=["q"]
    ),
    "bytes_whose_length_prefix_runs_past_the_end": Case(
        "text_embedding",
        [Tensor("text", "BYTES", [1, 1], struct.pack("<I", 99) + b"hello")],
        "expected 1 string elements for inference input 'text' for model 'text_embedding', got 0",
    ),
    "an_unknown_model": Case(
        "nosuch", [_x()], "Request for unknown model: 'nosuch' is not found", status=(404, "NOT_FOUND")
    ),
}


def _http(server: TritonServer, case: Case) -> tuple[int, str]:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": t.name,
                    "shape": t.shape,
                    "datatype": t.datatype,
                    "parameters": {"binary_data_size": len(t.data)},
                }
                for t in case.inputs
            ],
            "outputs": [{"name": name} for name in case.outputs],
        }
    ).encode()
    body = header + b"".join(t.data for t in case.inputs)
    request = (
        f"POST /v2/models/{case.model}/infer HTTP/1.1\r\nHost: test\r\n"
        f"Content-Type: application/octet-stream\r\nInference-Header-Content-Length: {len(header)}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    [(status, answer)] = exchange(server, request, timeout=ANSWER_GUARD_S)
    return status, json.loads(answer)["error"]


def _grpc(server: TritonServer, case: Case) -> tuple[str, str]:
    request = service_pb2.ModelInferRequest(model_name=case.model)
    for tensor in case.inputs:
        request.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        request.raw_input_contents.append(tensor.data)
    for name in case.outputs:
        request.outputs.add(name=name)
    with grpc.insecure_channel(server.grpc_url) as channel, pytest.raises(grpc.RpcError) as error:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=ANSWER_GUARD_S)
    return error.value.code().name, error.value.details()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_requests_the_config_does_not_allow_are_refused_naming_the_input(
    fault_server: TritonServer, good_traffic, protocol: str
) -> None:
    """Each case, one after another while good requests flow: answered at once with the exact
    refusal (before: ``[0, 0]`` never answered, ``[1, 0]`` a 500, a too-long sequence ran)."""
    answers, expected = {}, {}
    with good_traffic():
        for name, case in CASES.items():
            status, message = _http(fault_server, case) if protocol == "http" else _grpc(fault_server, case)
            answers[name] = (status, message)
            if protocol == "http":
                expected[name] = (case.status[0], case.message)
            else:
                expected[name] = (case.status[1], case.grpc_message or case.message)
    assert answers == expected


def test_a_generate_request_gets_the_same_allow_list(fault_server: TritonServer) -> None:
    """``/generate`` takes inputs as top-level JSON values and Triton shapes them itself: empty lists
    to the encoder became ``[1, 0]`` and a 500 from onnxruntime; now the zero dim is refused as over
    ``/infer``, and a good generate request is answered."""
    body = json.dumps({"input_ids": [], "attention_mask": []}).encode()
    path = f"/v2/models/{ENCODER}/generate"
    [(status, answer)] = exchange(fault_server, raw_request(body, path=path), timeout=ANSWER_GUARD_S)
    expected = _outside("input_ids", ENCODER, "[1,0]", "[1..32,1..16]", ZERO)
    assert (status, json.loads(answer)) == (400, {"error": expected})
    good = json.dumps({"input_ids": [101, 102], "attention_mask": [1, 1]}).encode()
    [(status, answer)] = exchange(fault_server, raw_request(good, path=path), timeout=ANSWER_GUARD_S)
    assert status == 200 and len(json.loads(answer)["embedding"]) == 384, answer[:200]


# Row 61: cases of CASES sent with their tensors in the client's own region (the names of CASES)
IN_REGION = (
    "a_wrong_datatype",
    "four_bytes_too_many",
    "zero_batch_to_an_onnx_model",
    "an_output_the_model_lacks",
    "bytes_whose_length_prefix_runs_past_the_end",
)
CUT_SHORT = "(it was cut short after registration)"


def _in_region(client, protocol: str, case: Case, region: str) -> str:
    """``case`` with each input read from ``region`` (one after another from its start) and each
    output written there; the refusal's message."""
    module, inputs, offset = client_module(protocol), [], 0
    for tensor in case.inputs:
        carried = module.InferInput(tensor.name, tensor.shape, tensor.datatype)
        carried.set_shared_memory(region, len(tensor.data), offset=offset)
        inputs.append(carried)
        offset += len(tensor.data)
    outputs = [module.InferRequestedOutput(name) for name in case.outputs]
    for output in outputs:
        output.set_shared_memory(region, 64, offset=offset)
    with pytest.raises(InferenceServerException) as refused:
        client.infer(case.model, inputs, outputs=outputs or None)
    return refused.value.message()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_tensors_in_shared_memory_pass_the_same_allow_list(
    fault_server: TritonServer, good_traffic, protocol: str
) -> None:
    """Row 61: the fronts read a client's region themselves; a request naming one is checked against
    its model's config like any other (the range's byte size as the input's), before the front reads
    a byte of it, and BYTES read from it are walked as BYTES in a body are. Then the file is cut to
    nothing: the same refusals come back, not the cut file's (nothing was read), while the BYTES
    input and a request the config accepts get the cut file's 400 (the front reads only then)."""
    client = connect(protocol, url(fault_server, protocol))
    name = f"allow_{protocol}_{os.getpid()}"
    path = Path("/dev/shm") / name
    with good_traffic():
        for cut in (False, True):
            path.write_bytes(b"\0" * 4096)
            client.register_system_shared_memory(name, f"/{name}", 4096)
            try:
                answers, expected = {}, {}
                for case_name in IN_REGION:
                    case = CASES[case_name]
                    data = b"".join(tensor.data for tensor in case.inputs)
                    with path.open("r+b") as region:
                        region.write(data)
                        if cut:
                            region.truncate(0)
                    message, wanted = _in_region(client, protocol, case, name), case.message
                    if cut and case.inputs[0].datatype == "BYTES":  # walked only once read
                        message, wanted = (CUT_SHORT if CUT_SHORT in message else message), CUT_SHORT
                    answers[case_name], expected[case_name] = message, wanted
                assert answers == expected
                if cut:
                    good = Case("trivial", [_x()], "")
                    assert CUT_SHORT in _in_region(client, protocol, good, name)
            finally:
                client.unregister_system_shared_memory(name)
                path.unlink(missing_ok=True)
    client.close()  # here, not in whichever thread collects it (gevent)


MARK = b"\xab" * 64  # where the output would go, before any request wrote it


def _output_in_region_over_http(server: TritonServer, region: str, asked: dict) -> tuple[int, str]:
    """``trivial`` with ``x`` read from the region's first 64 bytes and ``y`` asked into the next 64,
    with ``asked`` among ``y``'s parameters (tritonclient sends neither combination): (status, error)."""
    in_region = {"shared_memory_region": region, "shared_memory_byte_size": 64}
    body = {
        "inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "parameters": in_region}],
        "outputs": [{"name": "y", "parameters": {**in_region, "shared_memory_offset": 64, **asked}}],
    }
    [(status, answer)] = exchange(
        server, raw_request(json.dumps(body).encode(), path="/v2/models/trivial/infer")
    )
    return status, json.loads(answer).get("error", "") if status != 200 else ""


def _output_in_region_over_grpc(server: TritonServer, region: str, asked: dict) -> tuple[str, str]:
    request = service_pb2.ModelInferRequest(model_name="trivial")
    tensors = [request.inputs.add(name="x", datatype="FP32", shape=[1, 16]), request.outputs.add(name="y")]
    for tensor, offset in zip(tensors, (0, 64), strict=True):
        tensor.parameters["shared_memory_region"].string_param = region
        tensor.parameters["shared_memory_byte_size"].int64_param = 64
        tensor.parameters["shared_memory_offset"].int64_param = offset
    for key, value in asked.items():
        if isinstance(value, bool):
            tensors[1].parameters[key].bool_param = value
        else:
            tensors[1].parameters[key].int64_param = value
    with grpc.insecure_channel(server.grpc_url) as channel:
        try:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=ANSWER_GUARD_S)
        except grpc.RpcError as error:
            return error.code().name, error.details()
    return "OK", ""


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_output_in_shared_memory_asks_for_nothing_else(fault_server: TritonServer, protocol: str) -> None:
    """Row 76: an output in the client's region that also asks for binary data (HTTP) or a
    classification is refused in Triton 2.51's own words, and nothing is written into the region;
    ``binary_data: false`` over HTTP, and ``binary_data`` over gRPC (which Triton ignores there), are
    answered with the output in the region (before: the front answered both, a classification's strings
    written into a region meant for 16 floats)."""
    client = connect(protocol, url(fault_server, protocol))
    name = f"outputs_{protocol}_{os.getpid()}"
    path = Path("/dev/shm") / name
    path.write_bytes(np.ones(16, np.float32).tobytes() + MARK + b"\0" * (4096 - 128))
    client.register_system_shared_memory(name, f"/{name}", 4096)
    try:
        if protocol == "http":
            refused = {
                "binary_data": _output_in_region_over_http(fault_server, name, {"binary_data": True}),
                "classification": _output_in_region_over_http(fault_server, name, {"classification": 1}),
            }
            wanted = "Output 'y' can't set both 'shared_memory_region' and '{}'"
            assert refused == {key: (400, wanted.format(key)) for key in refused}
            assert path.read_bytes()[64:128] == MARK
            assert _output_in_region_over_http(fault_server, name, {"binary_data": False}) == (200, "")
        else:
            assert _output_in_region_over_grpc(fault_server, name, {"classification": 1}) == (
                "INVALID_ARGUMENT",
                "output 'y' can't set both 'shared_memory_region' and 'classification'",
            )
            assert path.read_bytes()[64:128] == MARK
            assert _output_in_region_over_grpc(fault_server, name, {"binary_data": True}) == ("OK", "")
        assert path.read_bytes()[64:128] != MARK  # the output accepted went to the region
    finally:
        client.unregister_system_shared_memory(name)
        path.unlink(missing_ok=True)
    client.close()
