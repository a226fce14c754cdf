"""One reading whatever case a client writes a header's name in (docs/SERVING.md, "One reading of every
request"). The HTTP front replaces or drops headers Triton reads: a form body's ``Content-Type``
(fault matrix row 5), ``Content-Encoding`` once it inflated the body, ``Inference-Header-Content-Length``
of a shared-memory inference it rewrote (row 61), and ``Accept-Encoding`` where it reads Triton's answer
itself. HTTP header names are case-insensitive, so each of these must act on the client's header
whatever its case, and the front must behave the same under either of aiohttp's HTTP parsers: the
compiled one hands well-known names over in their canonical case, the pure-Python one
(``AIOHTTP_NO_EXTENSIONS=1``, or an aiohttp installed without its extension) as the client sent them.

Measured on the front that kept the client's headers in a plain dict keyed by the names as sent: under
the pure-Python parser a lowercase ``accept-encoding: gzip`` was replaced by the front's ``identity``
(Triton answered uncompressed, as it does the capitalised name compressed), and an inference with an
output in shared memory and ``Accept-Encoding: gzip``, in any case and under either parser, was a 500:
the front read Triton's gzip answer as JSON.
"""

from __future__ import annotations

import gzip
import http.client
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from own_front import own_front
from shm_harness import client_file

from server import TritonServer

pytestmark = pytest.mark.integration
CASINGS: dict[str, Callable[[str], str]] = {"canonical": str, "lower": str.lower, "upper": str.upper}
Front = tuple[str, int]
Answer = tuple[int, dict[str, str], bytes]
ROW = 64  # trivial's x and y: FP32 [1, 16]


@pytest.fixture(scope="module")
def python_parser_front(
    fault_server: TritonServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Front]:
    """A second HTTP front before the fault server's Triton, as the launcher starts one but with
    aiohttp's pure-Python HTTP parser, which keeps every header name as the client sent it."""
    log_path = tmp_path_factory.mktemp("python_parser_front") / "http_front.log"
    flags = [
        f"--server-pid-file={fault_server.server_pid_file}",
        f"--owner-pid={os.getpid()}",
        f"--shm-prefix={fault_server.shm_prefix}",
    ]
    with own_front(
        "server.fronts.http_front",
        fault_server.triton_http_url,
        log_path,
        flags,
        fault_server.admin_key,
        {"AIOHTTP_NO_EXTENSIONS": "1"},
    ) as port:
        yield "127.0.0.1", port


@pytest.fixture(params=["compiled_parser", "python_parser"])
def front(request: pytest.FixtureRequest, fault_server: TritonServer) -> Front:
    """The fault server's own front (aiohttp's compiled parser), then the pure-Python parser's."""
    if request.param == "python_parser":
        return request.getfixturevalue("python_parser_front")
    host, port = fault_server.http_url.rsplit(":", 1)
    return host, int(port)


def _request(front: Front, method: str, path: str, body: bytes, headers: dict[str, str]) -> Answer:
    """One request with the header names exactly as given (http.client sends them so); the answer's
    status, headers (names lowercased) and body."""
    connection = http.client.HTTPConnection(*front, timeout=60)
    try:
        connection.request(method, path, body, headers)
        answer = connection.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
    finally:
        connection.close()


def _trivial_json(values: np.ndarray) -> bytes:
    return json.dumps(
        {"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": values.ravel().tolist()}]}
    ).encode()


def _y(answer: bytes) -> np.ndarray:
    [output] = json.loads(answer)["outputs"]
    return np.array(output["data"], np.float32).reshape(output["shape"])


@pytest.mark.parametrize("casing", CASINGS)
def test_a_form_body_is_answered_like_json_whatever_the_case(front: Front, casing: str) -> None:
    """Fault matrix row 5 with the name in each case: a valid 5 MB request sent form-encoded is answered
    as JSON (libevhtp's form parser segfaults tritonserver on it)."""
    text = {"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": ["a form-encoded request"]}
    body = json.dumps({"inputs": [text]}).encode() + b" " * (5 << 20)
    headers = {CASINGS[casing]("Content-Type"): "application/x-www-form-urlencoded"}
    status, _, answer = _request(front, "POST", "/v2/models/text_embedding/infer", body, headers)
    assert status == 200, answer[:200]
    assert json.loads(answer)["outputs"][0]["shape"] == [1, 384]


@pytest.mark.parametrize("casing", CASINGS)
def test_accept_encoding_is_the_clients_whatever_the_case(front: Front, casing: str) -> None:
    """The front asks Triton for an uncompressed answer only when the client names no encoding: a
    client's ``gzip``, in any case, gets Triton's gzip answer."""
    values = np.full((1, 16), 1.5, np.float32)
    headers = {"Content-Type": "application/json", CASINGS[casing]("Accept-Encoding"): "gzip"}
    status, answer_headers, answer = _request(
        front, "POST", "/v2/models/trivial/infer", _trivial_json(values), headers
    )
    assert status == 200, answer[:200]
    assert answer_headers.get("content-encoding") == "gzip", answer_headers
    assert np.array_equal(_y(gzip.decompress(answer)), values * 2)


@pytest.fixture
def region(front: Front, request: pytest.FixtureRequest) -> Iterator[tuple[str, Path]]:
    """A region of two rows registered with ``front``: x at 0, y written at ``ROW``."""
    name = f"casing_{os.getpid()}_{abs(hash(request.node.name)) % 10**8}"
    values = np.random.default_rng(7).uniform(1.0, 9.0, (1, 16)).astype(np.float32)
    client = httpclient.InferenceServerClient(f"{front[0]}:{front[1]}")
    with client_file(name, 2 * ROW, 0, values) as path:
        client.register_system_shared_memory(name, f"/{name}", 2 * ROW)
        try:
            yield name, path
        finally:
            client.unregister_system_shared_memory(name)
            client.close()


@pytest.mark.parametrize("encoding", ["identity", "gzip"])
@pytest.mark.parametrize("casing", CASINGS)
def test_a_shared_memory_inference_is_read_as_the_front_rewrote_it(
    front: Front, region: tuple[str, Path], casing: str, encoding: str
) -> None:
    """x in a region, y wanted in it: the front sends Triton x's bytes after a JSON header it wrote
    (fault matrix row 61) with that header's length, never the client's, whatever case the client's
    ``Inference-Header-Content-Length`` has; and it reads Triton's answer itself to write y, so it asks
    for it uncompressed whatever ``Accept-Encoding`` the client sent."""
    name, path = region
    x = np.frombuffer(path.read_bytes()[:ROW], np.float32).reshape(1, 16)
    shm = {"shared_memory_region": name, "shared_memory_byte_size": ROW}
    document = {
        "inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "parameters": shm}],
        "outputs": [{"name": "y", "parameters": {**shm, "shared_memory_offset": ROW}}],
    }
    body = json.dumps(document, indent=2).encode()  # longer than the compact header the front writes
    cased = CASINGS[casing]
    headers = {
        "Content-Type": "application/json",
        cased("Inference-Header-Content-Length"): str(len(body)),
        cased("Accept-Encoding"): encoding,
    }
    status, _, answer = _request(front, "POST", "/v2/models/trivial/infer", body, headers)
    assert status == 200, answer[:300]
    assert json.loads(answer)["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [1, 16]}]
    y = np.frombuffer(path.read_bytes()[ROW : 2 * ROW], np.float32).reshape(1, 16)
    assert np.array_equal(y, x * 2)
