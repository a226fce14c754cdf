"""Fault matrix rows 5 and 6: requests that crash or hang Triton 2.51's HTTP frontend, sent to the
server as ``make serve`` runs it (``server.fronts.http_front`` in front of Triton's HTTP port), with good
traffic alongside. Measured without the front (docs/SERVING.md, the fault matrix): the huge shapes,
the 5 MB form-encoded body and the deep nesting each killed tritonserver; the short body held its
connection until the client gave up. gRPC answers the same shapes with INVALID_ARGUMENT.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from harness import exchange, raw_request
from tritonclient.utils import InferenceServerException

from server import TritonServer

pytestmark = pytest.mark.integration
IDS = {"name": "sparse_ids", "shape": [1, 8], "datatype": "INT64", "data": [1] * 8}


def _dense(shape: list[int]) -> bytes:
    dense = {"name": "dense", "shape": shape, "datatype": "FP32", "data": [0.5] * 13}
    return json.dumps({"inputs": [dense, IDS]}).encode()


@pytest.mark.parametrize("shape", [[64, 2**40], [2**62, 13]], ids=["64x2^40", "2^62x13"])
def test_huge_declared_shape(fault_server: TritonServer, good_traffic, shape: list[int]) -> None:
    with good_traffic():
        [(status, body)] = exchange(fault_server, raw_request(_dense(shape)))
        assert status == 400
        elements = shape[0] * shape[1]
        assert json.loads(body)["error"].startswith(
            f"input 'dense' declares shape {shape} ({elements} elements) but the request carries only"
        )
        client = grpcclient.InferenceServerClient(fault_server.grpc_url)
        dense = grpcclient.InferInput("dense", [1, 13], "FP32")
        dense.set_data_from_numpy(np.zeros((1, 13), np.float32))
        dense.set_shape(shape)  # the same lie as over HTTP: 52 bytes for a huge declared shape
        ids = grpcclient.InferInput("sparse_ids", [1, 8], "INT64")
        ids.set_data_from_numpy(np.ones((1, 8), np.int64))
        with pytest.raises(InferenceServerException) as error:
            client.infer("recommender", [dense, ids])
        assert error.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_large_form_encoded_body_is_answered(fault_server: TritonServer, good_traffic) -> None:
    """``curl -d`` sends form-encoded: a valid 5 MB request (padded with JSON whitespace) is answered.
    To the text model: its BYTES input bounds no body below the front's 64 MiB (the recommender's
    largest valid request is far smaller, and a 5 MB body to it is a 413: row 60)."""
    text = {"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": ["a form-encoded request"]}
    body = json.dumps({"inputs": [text]}).encode() + b" " * (5 << 20)
    request = raw_request(body, "application/x-www-form-urlencoded", path="/v2/models/text_embedding/infer")
    with good_traffic():
        [(status, answer)] = exchange(fault_server, request)
    assert status == 200, answer[:200]
    assert json.loads(answer)["outputs"][0]["shape"] == [1, 384]


def test_deep_nesting_is_refused(fault_server: TritonServer, good_traffic) -> None:
    with good_traffic():
        # to the text model: the recommender takes no 200 kB body (row 60)
        request = raw_request(b"[" * 200_000, path="/v2/models/text_embedding/infer")
        [(status, body)] = exchange(fault_server, request)
    assert (status, json.loads(body)) == (400, {"error": "request JSON nests too deeply"})


def test_number_inside_bytes_data_is_named(fault_server: TritonServer, good_traffic) -> None:
    """Triton alone answers a JSON number in BYTES data with a 500 that names no input (measured on the
    text model, tests/integration/test_text_embedding.py); through the front it is a 400 that does."""
    text = {"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": [42]}
    with good_traffic():
        [(status, body)] = exchange(fault_server, raw_request(json.dumps({"inputs": [text]}).encode()))
    expected = {"error": "input 'text': BYTES data must be JSON strings, got 42"}
    assert (status, json.loads(body)) == (400, expected)


def test_body_above_the_limit_is_refused(fault_server: TritonServer, good_traffic) -> None:
    """A declared body above what its route takes is refused from its headers alone, before a byte of
    it is read: 65 MiB on any route above the front's 64 MiB, an inference above its model's largest
    valid request (row 60: the recommender's 64 rows of 21 values at 40 JSON characters each, plus 64
    KiB of header), and a shared-memory call above 256 KiB (the front parses it on its event loop)."""
    register = "/v2/systemsharedmemory/region/r/register"
    with good_traffic():
        [(status, body)] = exchange(
            fault_server, raw_request(b"", length=65 << 20, path="/v2/repository/index")
        )
        [(to_model, refusal)] = exchange(fault_server, raw_request(b"", length=200_000))
        [(to_shm, shm_refusal)] = exchange(fault_server, raw_request(b"", length=300_000, path=register))
    expected = "request body of 68157440 bytes exceeds 67108864, the largest the front takes"
    assert (status, json.loads(body)) == (413, {"error": expected})
    expected = "request body of 200000 bytes exceeds 119296, the largest request model 'recommender' takes"
    assert (to_model, json.loads(refusal)) == (413, {"error": expected})
    expected = "request body of 300000 bytes exceeds 262144, the largest a shared-memory call takes"
    assert (to_shm, json.loads(shm_refusal)) == (413, {"error": expected})


def test_short_body_times_out_and_frees_the_connection(fault_server: TritonServer, good_traffic) -> None:
    """Content-Length 1000 with 10 bytes sent: 408 after the front's body timeout (3 s here)."""
    with good_traffic():
        [(status, body)] = exchange(fault_server, raw_request(b'{"inputs":', length=1000), timeout=20)
    assert (status, json.loads(body)) == (408, {"error": "request body not complete within 3 s"})


def test_pipelined_requests_are_all_answered(fault_server: TritonServer, good_traffic) -> None:
    """100 requests written back to back on one connection: 100 answers, in order, all 200."""
    dense = {"name": "dense", "shape": [1, 13], "datatype": "FP32", "data": [0.5] * 13}
    one = raw_request(json.dumps({"inputs": [dense, IDS]}).encode())
    with good_traffic():
        answers = exchange(fault_server, one * 100, responses=100)
    assert [status for status, _ in answers] == [200] * 100
