"""Fault matrix rows 5 and 6: requests that crash or hang Triton 2.51's HTTP frontend, sent to the
server as ``make serve`` runs it (``server.http_guard`` in front of Triton's HTTP port), with good
traffic alongside. Measured without the guard (README "Bad input and overload"): the huge shapes,
the 5 MB form-encoded body and the deep nesting each killed tritonserver; the short body held its
connection until the client gave up. gRPC answers the same shapes with INVALID_ARGUMENT.
"""

from __future__ import annotations

import json
import re
import socket

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from server import TritonServer

pytestmark = pytest.mark.integration
PATH = "/v2/models/recommender/infer"
IDS = {"name": "sparse_ids", "shape": [1, 8], "datatype": "INT64", "data": [1] * 8}


def _exchange(server: TritonServer, raw: bytes, responses: int = 1, timeout: float = 30) -> list[tuple]:
    """Send raw bytes on one connection; read ``responses`` HTTP responses as (status, body)."""
    host, port = server.http_url.rsplit(":", 1)
    answers: list[tuple[int, bytes]] = []
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(raw)
        buffer = b""
        while len(answers) < responses:
            head_end = buffer.find(b"\r\n\r\n")
            if head_end >= 0:
                head = buffer[:head_end].decode("latin-1")
                length = int(re.search(r"(?i)content-length: *(\d+)", head).group(1))
                if len(buffer) >= head_end + 4 + length:
                    status = int(head.split()[1])
                    answers.append((status, buffer[head_end + 4 : head_end + 4 + length]))
                    buffer = buffer[head_end + 4 + length :]
                    continue
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            buffer += chunk
    return answers


def _request(body: bytes, content_type: str = "application/json", length: int | None = None) -> bytes:
    size = len(body) if length is None else length
    return (
        f"POST {PATH} HTTP/1.1\r\nHost: test\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {size}\r\n\r\n"
    ).encode() + body


def _dense(shape: list[int]) -> bytes:
    dense = {"name": "dense", "shape": shape, "datatype": "FP32", "data": [0.5] * 13}
    return json.dumps({"inputs": [dense, IDS]}).encode()


@pytest.mark.parametrize("shape", [[64, 2**40], [2**62, 13]], ids=["64x2^40", "2^62x13"])
def test_huge_declared_shape(fault_server: TritonServer, good_traffic, shape: list[int]) -> None:
    with good_traffic():
        [(status, body)] = _exchange(fault_server, _request(_dense(shape)))
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
    """``curl -d`` sends form-encoded: a valid 5 MB request (padded with JSON whitespace) is answered."""
    dense = {"name": "dense", "shape": [1, 13], "datatype": "FP32", "data": [0.5] * 13}
    body = json.dumps({"inputs": [dense, IDS]}).encode() + b" " * (5 << 20)
    with good_traffic():
        [(status, answer)] = _exchange(fault_server, _request(body, "application/x-www-form-urlencoded"))
    assert status == 200, answer[:200]
    assert json.loads(answer)["outputs"][0]["shape"] == [1, 1]


def test_deep_nesting_is_refused(fault_server: TritonServer, good_traffic) -> None:
    with good_traffic():
        [(status, body)] = _exchange(fault_server, _request(b"[" * 200_000))
    assert (status, json.loads(body)) == (400, {"error": "request JSON nests too deeply"})


def test_body_above_the_limit_is_refused(fault_server: TritonServer, good_traffic) -> None:
    body = b" " * (65 << 20)
    with good_traffic():
        [(status, _)] = _exchange(fault_server, _request(body))
    assert status == 413


def test_short_body_times_out_and_frees_the_connection(fault_server: TritonServer, good_traffic) -> None:
    """Content-Length 1000 with 10 bytes sent: 408 after the guard's body timeout (3 s here)."""
    with good_traffic():
        [(status, body)] = _exchange(fault_server, _request(b'{"inputs":', length=1000), timeout=20)
    assert (status, json.loads(body)) == (408, {"error": "request body not complete within 3 s"})


def test_pipelined_requests_are_all_answered(fault_server: TritonServer, good_traffic) -> None:
    """100 requests written back to back on one connection: 100 answers, in order, all 200."""
    dense = {"name": "dense", "shape": [1, 13], "datatype": "FP32", "data": [0.5] * 13}
    one = _request(json.dumps({"inputs": [dense, IDS]}).encode())
    with good_traffic():
        answers = _exchange(fault_server, one * 100, responses=100)
    assert [status for status, _ in answers] == [200] * 100
