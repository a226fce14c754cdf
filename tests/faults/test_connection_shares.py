"""Fault matrix row 73: the connections one client address (and all clients) may hold open on a front.

Measured with the fronts as they were: one address held 19,000 idle gRPC connections (each had sent the
HTTP/2 preface and SETTINGS) or 8,000 kept-alive HTTP ones, the front growing by ~5 KB and one file
descriptor for each, until its open-file limit (20,000 here) refused every other client's connection.
Here both fronts run with small shares (4 per address, 6 in all) before a small server of their own,
and their logs name the addresses they refused and why.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from harness import GOOD_MODEL
from own_front import own_front, refusals_logged
from resilience_fixtures import small_server
from tritonclient.grpc import service_pb2

from server import TritonServer
from server.fronts import h2c
from soak.raw_grpc import call_headers, exchange, message

pytestmark = pytest.mark.integration
PER_ADDRESS, TOTAL = 4, 6
HOLDER, OTHER, THIRD = "127.0.0.7", "127.0.0.8", "127.0.0.9"  # client addresses on the loopback
HANG_GUARD_S = 60  # how long an answer may take before it counts as never: not a latency bound
SHARES = [f"--max-client-connections={PER_ADDRESS}", f"--max-connections={TOTAL}"]
FULL = f"the front already holds {TOTAL} client connections, all it takes"
HEALTH = b"GET /v2/health/live HTTP/1.1\r\nHost: test\r\n\r\n"


def _beyond_share(address: str) -> str:
    return f"this client address ({address}) already holds {PER_ADDRESS} connections to the front"


@pytest.fixture(scope="module")
def triton(spec_data: dict, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    with small_server(spec_data, tmp_path_factory, "connections", pipeline=False) as server:
        yield server


def _connect(port: int, source: str) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=HANG_GUARD_S, source_address=(source, 0))


def _grpc_call(port: int, source: str) -> tuple[str, str]:
    """One ``trivial`` inference written frame by frame from ``source``: (status, message or failure)."""
    request = service_pb2.ModelInferRequest(model_name=GOOD_MODEL)
    request.inputs.add(name="x", datatype="FP32", shape=[1, 16])
    request.raw_input_contents.append(np.ones((1, 16), np.float32).tobytes())
    block = call_headers("/inference.GRPCInferenceService/ModelInfer", [], HANG_GUARD_S)
    reply = exchange(("127.0.0.1", port), block, message(request.SerializeToString()), HANG_GUARD_S, source)
    return reply.code, reply.message or reply.failure


def _grpc_held(port: int, source: str) -> socket.socket:
    """A connection from ``source`` that completed its HTTP/2 handshake and was not turned away."""
    sock = _connect(port, source)
    sock.sendall(h2c.PREFACE + h2c.settings_frame({}) + h2c.frame(h2c.PING, 0, 0, b"12345678"))
    received = b""
    while b"12345678" not in received:  # the PING's answer: the front read the handshake and served it
        chunk = sock.recv(1 << 16)
        assert chunk, f"connection from {source} closed: {received!r}"
        received += chunk
    return sock


def _http_answer(port: int, source: str, sock: socket.socket | None = None) -> bytes:
    """The answer to a health GET on ``sock`` (a new connection from ``source`` when None)."""
    sock = sock or _connect(port, source)
    sock.sendall(HEALTH)
    answer = b""
    while b"\r\n\r\n" not in answer or len(answer) < answer.index(b"\r\n\r\n") + 4 + _length(answer):
        chunk = sock.recv(1 << 16)
        if not chunk:
            break
        answer += chunk
    return answer


def _assert_refusals_logged(log_path: Path) -> None:
    """The front, stopped, logged whom it refused and why: ``HOLDER`` beyond its share (its first line
    written at once), ``THIRD``, refused once, beyond the total."""
    assert refusals_logged(log_path, HOLDER, "connections beyond its address's share")[:1] == [1]
    assert refusals_logged(log_path, THIRD, "connections beyond the front's total") == [1]


def _length(answer: bytes) -> int:
    head = answer.split(b"\r\n\r\n", 1)[0].lower()
    for line in head.split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


def test_grpc_front_refuses_connections_beyond_an_address_share(triton: TritonServer, tmp_path: Path):
    log_path = tmp_path / "grpc_front.log"
    with own_front("server.fronts.grpc_front", triton.grpc_url, log_path, SHARES) as port:
        held = [_grpc_held(port, HOLDER) for _ in range(PER_ADDRESS)]
        code, why = _grpc_call(port, HOLDER)
        assert code == "RESOURCE_EXHAUSTED" and _beyond_share(HOLDER) in why, (code, why)
        assert _grpc_call(port, OTHER) == ("OK", "")  # another address is served meanwhile

        held += [_grpc_held(port, OTHER) for _ in range(TOTAL - PER_ADDRESS)]
        code, why = _grpc_call(port, THIRD)
        assert code == "RESOURCE_EXHAUSTED" and FULL in why, (code, why)

        held.pop(0).close()  # one of HOLDER's: its place is free again once the front saw it close
        deadline = time.monotonic() + HANG_GUARD_S
        while (answer := _grpc_call(port, HOLDER)) != ("OK", ""):
            assert time.monotonic() < deadline, answer
            time.sleep(0.1)
        for sock in held:
            sock.close()
    _assert_refusals_logged(log_path)


def test_http_front_refuses_connections_beyond_an_address_share(triton: TritonServer, tmp_path: Path):
    log_path = tmp_path / "http_front.log"
    with own_front("server.fronts.http_front", triton.http_url, log_path, SHARES) as port:
        held = [_connect(port, HOLDER) for _ in range(PER_ADDRESS)]
        for sock in held:  # kept alive after an answer, as a client's pool keeps them
            assert _http_answer(port, HOLDER, sock).startswith(b"HTTP/1.1 200"), "a held connection"
        refused = _http_answer(port, HOLDER)
        assert refused.startswith(b"HTTP/1.1 503") and b"Connection: close" in refused, refused
        assert _beyond_share(HOLDER) in json.loads(refused.split(b"\r\n\r\n", 1)[1])["error"], refused
        assert _http_answer(port, OTHER).startswith(b"HTTP/1.1 200")  # another address is served

        for _ in range(TOTAL - PER_ADDRESS):
            held.append(_connect(port, OTHER))
            assert _http_answer(port, OTHER, held[-1]).startswith(b"HTTP/1.1 200")
        refused = _http_answer(port, THIRD)
        assert refused.startswith(b"HTTP/1.1 503") and FULL.encode() in refused, refused

        held.pop(0).close()
        deadline = time.monotonic() + HANG_GUARD_S
        while not (answer := _http_answer(port, HOLDER)).startswith(b"HTTP/1.1 200"):
            assert time.monotonic() < deadline, answer
            time.sleep(0.1)
        for sock in held:
            sock.close()
    _assert_refusals_logged(log_path)
