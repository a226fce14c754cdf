"""Fault matrix rows 15-18: the HTTP fuzz. Every request those rows name is a regression test here
(measured before: the duplicate keys aborted tritonserver, every stub, the front and the watchdog with
it; the rest were 500s from the front or Triton for a fault of the request), and a seeded mutation
fuzzer (``soak.http_fuzz``) runs a few hundred cases over every endpoint ``make serve`` exposes,
checking after each that the server lives, kept its stubs and answers a good request.
"""

from __future__ import annotations

import gzip
import json
import zlib

import numpy as np
import pytest
import tritonclient.http as httpclient
from harness import GOOD_MODEL, exchange, trivial_inputs
from tritonclient.utils import InferenceServerException

from server import TritonServer
from server.stubs import server_stubs
from soak import raw_http
from soak.http_fuzz import fuzz

pytestmark = pytest.mark.integration
INFER = "/v2/models/recommender/infer"
IDS = {"name": "sparse_ids", "shape": [1, 8], "datatype": "INT64", "data": [1] * 8}
DENSE = {"name": "dense", "shape": [1, 13], "datatype": "FP32", "data": [0.5] * 13}
GOOD = json.dumps({"inputs": [DENSE, IDS]}).encode()
BINARY_INPUT = {**{k: v for k, v in DENSE.items() if k != "data"}, "parameters": {"binary_data_size": 52}}
BINARY_HEADER = json.dumps({"inputs": [BINARY_INPUT, IDS]}).encode()
BINARY = BINARY_HEADER + b"\0" * 52
HEADER_LENGTH = "Inference-Header-Content-Length"
JSON = [("Content-Type", "application/json")]
GZIP_ERROR = "Error -3 while decompressing data: incorrect header check"
REGISTER = "/v2/systemsharedmemory/region/r1/register"


def _raw(method: str, path: str, headers: list[tuple[str, str]], body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: test", *(f"{k}: {v}" for k, v in headers)]
    return ("\r\n".join([*lines, f"Content-Length: {len(body)}"]) + "\r\n\r\n").encode() + body


def _infer_with(**changes) -> bytes:
    return json.dumps({"inputs": [{**DENSE, **changes}, IDS]}).encode()


def _header_length(value: str) -> tuple[bytes, int, str]:
    request = _raw("POST", INFER, [*JSON, (HEADER_LENGTH, value)], BINARY)
    shown = repr(value[:40])
    return (
        request,
        400,
        f"{HEADER_LENGTH} {shown} must be a number of bytes within the body ({len(BINARY)} bytes)",
    )


def _parentheses(method: str, path: str) -> tuple[bytes, int, str]:
    request = _raw(method, path, [("Content-Type", "(" * 239)], GOOD if method == "POST" else b"")
    return request, 400, f"Content-Type {'(' * 40!r} is not a media type (type/subtype)"


def _json(body: bytes, message: str, path: str = INFER) -> tuple[bytes, int, str]:
    return _raw("POST", path, JSON, body), 400, message


DUPLICATE_SHAPE = (
    b'{"inputs":[{"name":"dense","shape":[1099511627776],"shape":[1],"datatype":"FP32","data":[0]}]}'
)
HUGE_FIRST = b'{"inputs":[{"name":"dense","shape":[1099511627776],"datatype":"FP32","data":[0]}],"inputs":['
CLASSIFY = [{"name": "probability", "parameters": {"classification": "x"}}]
# name -> (request, status, error message): the requests of rows 15-17, one by one
NAMED = {
    "duplicate_shape_key": _json(DUPLICATE_SHAPE, "request JSON has the key 'shape' twice in one object"),
    "duplicate_inputs_key": _json(
        HUGE_FIRST + json.dumps(DENSE).encode() + b"]}",
        "request JSON has the key 'inputs' twice in one object",
    ),
    "duplicate_header_length": (
        _raw("POST", INFER, [*JSON, (HEADER_LENGTH, "5"), (HEADER_LENGTH, str(len(BINARY_HEADER)))], BINARY),
        400,
        "header 'inference-header-content-length' is sent 2 times; send it once",
    ),
    "content_type_parentheses_health": _parentheses("GET", "/v2/health/ready"),
    "content_type_parentheses_infer": _parentheses("POST", INFER),
    "header_length_superscript_two": _header_length("²"),
    "header_length_of_4301_digits": _header_length("9" * 4301),
    "gzip_header_on_a_plain_body": (
        _raw("POST", INFER, [*JSON, ("Content-Encoding", "gzip")], GOOD),
        400,
        f"request body is not valid gzip data: {GZIP_ERROR}",
    ),
    "deflate_header_on_a_plain_body": (
        _raw("POST", INFER, [*JSON, ("Content-Encoding", "deflate")], GOOD),
        400,
        f"request body is not valid deflate data: {GZIP_ERROR}",
    ),
    "binary_data_size_a_string": _json(
        json.dumps({"inputs": [{**BINARY_INPUT, "parameters": {"binary_data_size": "x"}}, IDS]}).encode(),
        "input 'dense' parameters: 'binary_data_size' must be an integer, got \"x\"",
    ),
    "datatype_a_number": _json(_infer_with(datatype=5), "input 'dense': 'datatype' must be a string, got 5"),
    "shape_a_string": _json(_infer_with(shape="1,13"), "input 'dense': 'shape' must be a list, got \"1,13\""),
    "data_of_booleans": _json(
        _infer_with(data=[True] * 13), "input 'dense': FP32 data must be JSON numbers, got true"
    ),
    "request_parameters_a_list": _json(
        json.dumps({"inputs": [DENSE, IDS], "parameters": [1]}).encode(),
        "request: 'parameters' must be an object, got [1]",
    ),
    "classification_a_string": _json(
        json.dumps({"inputs": [DENSE, IDS], "outputs": CLASSIFY}).encode(),
        "output 'probability' parameters: 'classification' must be an integer, got \"x\"",
    ),
    "fp32_beyond_its_range": _json(  # row 68: Triton would run it as infinity
        _infer_with(data=[1e39] + [0.5] * 12),
        "input 'dense': 1e+39 is beyond FP32 (±3.4e38); Triton would run it as infinity",
    ),
    "shm_register_without_key": _json(
        b'{"byte_size": 64}', "shared memory register request: 'key' is missing", REGISTER
    ),
    "shm_register_bad_json": _json(
        b'{"key": ', "request body is not valid JSON: Expecting value: line 1 column 9 (char 8)", REGISTER
    ),
}


def _stub_pids(server: TritonServer) -> set[int]:
    return {stub.pid for stub in server_stubs(server.pid or 0) if stub.alive}


@pytest.mark.parametrize("name", NAMED)
def test_a_named_malformed_request_is_refused_naming_its_fault(
    fault_server: TritonServer, good_traffic, name: str
) -> None:
    raw, status, message = NAMED[name]
    stubs = _stub_pids(fault_server)
    with good_traffic():
        [(answered, body)] = exchange(fault_server, raw)
    assert (answered, json.loads(body)) == (status, {"error": message})
    assert _stub_pids(fault_server) == stubs


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_compressed_body_is_answered_as_the_plain_one(fault_server: TritonServer, encoding: str) -> None:
    """A valid gzip body got 400 through the front but 200 directly (the front forwarded the
    inflated body still marked gzip)."""
    packed = gzip.compress(GOOD) if encoding == "gzip" else zlib.compress(GOOD)
    [(status, body)] = exchange(
        fault_server, _raw("POST", INFER, [*JSON, ("Content-Encoding", encoding)], packed)
    )
    [(plain_status, plain)] = exchange(fault_server, _raw("POST", INFER, JSON, GOOD))
    assert (status, json.loads(body)) == (plain_status, json.loads(plain)) == (200, json.loads(plain))


def test_fuzz_the_http_front(fault_server: TritonServer) -> None:
    """300 seeded cases over every endpoint: no answer of 500 or more, no stub lost, the server live
    and answering a good request after each (``make soak`` runs more)."""
    client = httpclient.InferenceServerClient(fault_server.http_url)
    stubs = _stub_pids(fault_server)

    def still_serving() -> list[str]:
        problems = [] if client.is_server_live() else ["not live"]
        lost = stubs - _stub_pids(fault_server)
        problems += [f"stubs gone: {sorted(lost)}"] if lost else []
        try:
            answer = client.infer(GOOD_MODEL, trivial_inputs("http")).as_numpy("y")
            problems += [] if np.array_equal(answer, np.full((1, 16), 2.0, np.float32)) else ["wrong answer"]
        except InferenceServerException as error:
            problems.append(f"a good request failed: {error}")
        return problems

    models = ["trivial", "recommender", "recommender_pipeline", "text_embedding", "text_embedding_encoder"]
    report = fuzz(fault_server.http_url, models, cases=300, seed=0, after_each=still_serving)
    print(report.text())
    assert report.cases == 300
    assert report.findings == [], report.text()
    front_log = fault_server.log_path.with_name("http_front.log").read_text()
    assert "Traceback" not in front_log  # a client's malformed request is one log line, not a traceback


def test_a_connection_closed_without_a_status_line_is_no_answer(fault_server: TritonServer) -> None:
    """The soak's one HTTP client (``soak.raw_http``, the fuzz's) on a real server that ends the
    connection with no HTTP answer: the gRPC front, sent an HTTP/1.1 request, closes it (with an HTTP/2
    GOAWAY). That is no answer, as every caller counts it (the fuzz once excused a closed connection);
    the same request to the HTTP front is answered."""
    request = raw_http.Request("GET", "/v2/health/live", [])
    replies = {}
    for front, at in (("grpc", fault_server.grpc_url), ("http", fault_server.http_url)):
        host, port = at.rsplit(":", 1)
        replies[front] = raw_http.exchange((host, int(port)), request)
    assert replies["grpc"].failure.startswith("closed") and not replies["grpc"].status, replies["grpc"]
    assert (replies["http"].status, replies["http"].failure) == (200, ""), replies["http"]
