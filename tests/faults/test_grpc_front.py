"""Fault matrix: gRPC gets the HTTP front's protection.

Measured without the gRPC front: one 97-byte request (``text_embedding_encoder``, ``INT64 [1, 2**61]``
with empty raw contents) wrapped Triton's byte-size check to 0 and killed the encoder's stub every
time; any message up to 2 GiB was accepted; ``recommender\\x00x`` reached ``recommender``; and a
direct request to an ensemble member skipped what the ensemble guarantees. Triton's own ports, on
loopback behind the fronts, refuse inference and shared memory that did not pass a front.
"""

from __future__ import annotations

import queue

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from harness import PROTOCOLS, trivial_inputs, url
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from client.connection import connect
from server import TritonServer
from server.stubs import server_stubs
from soak.faults import overflowing_request

pytestmark = pytest.mark.integration
ENCODER, TEXT = "text_embedding_encoder", "text_embedding"
INVALID = {"http": "400", "grpc": "StatusCode.INVALID_ARGUMENT"}
RESTRICTED = {"http": "403", "grpc": "StatusCode.UNAVAILABLE"}


def _live_stubs(server: TritonServer) -> set[int]:
    return {stub.pid for stub in server_stubs(server.pid or 0) if stub.alive}


def _embeds(server: TritonServer) -> None:
    text = grpcclient.InferInput("text", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([["still serving"]], dtype=object))
    embedding = grpcclient.InferenceServerClient(server.grpc_url).infer(TEXT, [text]).as_numpy("embedding")
    assert embedding.shape == (1, 384) and np.isfinite(embedding).all()


def test_the_overflowing_shape_kills_no_stub(fault_server: TritonServer, good_traffic) -> None:
    stubs = _live_stubs(fault_server)
    with grpc.insecure_channel(fault_server.grpc_url) as channel, good_traffic():
        service = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for _ in range(3):  # measured without the front: each one killed the encoder's stub
            with pytest.raises(grpc.RpcError) as error:
                service.ModelInfer(overflowing_request(ENCODER, ("input_ids", "attention_mask")), timeout=60)
            assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert error.value.details() == (
                "input 'input_ids' declares shape [1, 2305843009213693952] (2305843009213693952 elements) "
                "but its raw data carries only 0 bytes for it"
            )
    assert _live_stubs(fault_server) == stubs
    _embeds(fault_server)


@pytest.mark.parametrize("compression", [grpc.Compression.Gzip, grpc.Compression.Deflate])
def test_a_compressed_message_is_checked_like_any_other(fault_server: TritonServer, compression) -> None:
    """The front reads each message itself: a compressed one is unpacked and checked (row 19's
    shape refused in the front's words, no stub killed), a good one answered."""
    stubs = _live_stubs(fault_server)
    with grpc.insecure_channel(fault_server.grpc_url, compression=compression) as channel:
        service = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as error:
            service.ModelInfer(overflowing_request(ENCODER, ("input_ids", "attention_mask")), timeout=60)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "declares shape [1, 2305843009213693952]" in (error.value.details() or "")
    client = grpcclient.InferenceServerClient(fault_server.grpc_url)
    answer = client.infer("trivial", trivial_inputs("grpc"), compression_algorithm=compression.name.lower())
    assert answer.as_numpy("y").shape == (1, 16)
    assert _live_stubs(fault_server) == stubs


def test_a_stream_answers_the_overflowing_shape_on_the_stream(fault_server: TritonServer) -> None:
    """ModelStreamInfer: the refused message gets its error on the stream, the next one its answer."""
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(fault_server.grpc_url)
    stubs = _live_stubs(fault_server)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        overflowing = []
        for name in ("input_ids", "attention_mask"):  # empty raw contents declared as [1, 2**61]
            tensor = grpcclient.InferInput(name, [1, 0], "INT64")
            tensor.set_data_from_numpy(np.zeros((1, 0), np.int64))
            overflowing.append(tensor.set_shape([1, 2**61]))
        client.async_stream_infer(ENCODER, overflowing, request_id="bad")
        good = []
        for name in ("input_ids", "attention_mask"):
            tensor = grpcclient.InferInput(name, [1, 4], "INT64")
            tensor.set_data_from_numpy(np.ones((1, 4), np.int64))
            good.append(tensor)
        client.async_stream_infer(ENCODER, good, request_id="good")
        got = [answers.get(timeout=60), answers.get(timeout=60)]
    finally:
        client.stop_stream()
    [error] = [error for _, error in got if error is not None]
    [result] = [result for result, _ in got if result is not None]
    assert "input 'input_ids' declares shape [1, 2305843009213693952]" in error.message()
    assert result.as_numpy("embedding").shape == (1, 384)
    assert _live_stubs(fault_server) == stubs


def test_a_message_above_the_bound_is_refused_before_triton(fault_server: TritonServer) -> None:
    """A 65 MiB text: RESOURCE_EXHAUSTED from the front (measured without it: a 300 MB text was taken
    and left tritonserver 1.4 GB larger for good)."""
    text = grpcclient.InferInput("text", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"a" * (65 << 20)]], dtype=object))
    with pytest.raises(InferenceServerException) as error:
        grpcclient.InferenceServerClient(fault_server.grpc_url).infer(TEXT, [text])
    assert error.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    _embeds(fault_server)


def test_a_model_name_with_a_nul_is_refused(fault_server: TritonServer) -> None:
    client = grpcclient.InferenceServerClient(fault_server.grpc_url)
    for call in (
        lambda: client.infer("trivial\x00x", trivial_inputs("grpc")),
        lambda: client.get_model_metadata("trivial\x00x"),
        lambda: client.is_model_ready("trivial\x00x"),
    ):
        with pytest.raises(InferenceServerException) as error:
            call()
        assert error.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert "holds a control character" in error.value.message()
    with pytest.raises(InferenceServerException) as error:  # HTTP: an escaped NUL is no plain target
        httpclient.InferenceServerClient(fault_server.http_url).infer("trivial%00x", trivial_inputs("http"))
    assert error.value.status() == "400" and "request target" in error.value.message()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_tritons_own_ports_take_no_inference_around_the_fronts(fault_server: TritonServer, protocol) -> None:
    own = fault_server.triton_http_url if protocol == "http" else fault_server.triton_grpc_url
    client = connect(protocol, own)
    assert client.is_server_live()  # health, metadata and statistics stay open (the launcher polls them)
    with pytest.raises(InferenceServerException) as error:
        client.infer("trivial", trivial_inputs(protocol))
    assert error.value.status() == RESTRICTED[protocol]
    assert "restricted" in error.value.message()
    with pytest.raises(InferenceServerException) as error:
        client.register_system_shared_memory("r", "/r", 64)
    assert error.value.status() == RESTRICTED[protocol]


def _tokens(protocol: str, ids: list[int], mask: list[int]) -> list:
    module = httpclient if protocol == "http" else grpcclient
    tensors = []
    for name, values in (("input_ids", ids), ("attention_mask", mask)):
        tensor = module.InferInput(name, [1, len(values)], "INT64")
        tensor.set_data_from_numpy(np.array([values], np.int64))
        tensors.append(tensor)
    return tensors


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_ensemble_member_is_held_to_what_the_ensemble_sends(fault_server: TritonServer, protocol) -> None:
    """The encoder called by name gets only what the tokenizer would send it: ids inside the vocabulary,
    a 0/1 mask, as many mask values as ids (measured without: negative ids and any mask were
    answered, and mismatched lengths were a 500 from onnxruntime)."""
    client = connect(protocol, url(fault_server, protocol))
    stubs = _live_stubs(fault_server)
    cases = [
        ([-5, 7], [1, 1], "input 'input_ids' holds -5, outside its declared range [0, 30522)"),
        ([10**9, 7], [1, 1], "input 'input_ids' holds 1000000000, outside its declared range [0, 30522)"),
        ([101, 7], [1, 7], "input 'attention_mask' holds 7, outside its declared range [0, 2)"),
        ([101, 7], [1, 1, 1], "inputs must agree on axis 'sequence': 'attention_mask' 3, 'input_ids' 2"),
    ]
    for ids, mask, message in cases:
        with pytest.raises(InferenceServerException) as error:
            client.infer(ENCODER, _tokens(protocol, ids, mask))
        assert error.value.status() == INVALID[protocol], message
        assert message in error.value.message()
    embedding = client.infer(ENCODER, _tokens(protocol, [101, 7592, 102], [1, 1, 1])).as_numpy("embedding")
    assert embedding.shape == (1, 384) and np.isfinite(embedding).all()
    assert _live_stubs(fault_server) == stubs
