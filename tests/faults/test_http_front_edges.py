"""Fault matrix: the HTTP front's own edges. Measured before: 300 of 300 connections
whose headers never completed were still held after 58 s; with Triton down the front answered
``500 text/plain`` that tritonclient cannot parse; it logged a full traceback per readiness poll
while Triton started (8,746 lines per start); every HEAD got a 502; and a client that waits for
``100 Continue`` before it sends its body never got it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import tritonclient.http as httpclient
from harness import trivial_inputs
from process_stop import stop_every_thread
from resilience_fixtures import build_small_repository
from tritonclient.utils import InferenceServerException
from waiting_sockets import waiting_at

from server import ServerOptions, TritonServer
from server.ports import free_ports
from soak import raw_http

pytestmark = pytest.mark.integration
HANG_GUARD_S = 90  # not a latency bound: only how long a broken front may hold the test


def test_headers_that_never_complete_are_timed_out(fault_server: TritonServer, good_traffic) -> None:
    """50 connections trickle one byte of a header value every half second and never end their headers
    (within aiohttp's header-size limits that takes hours): each gets a 408 (after the fault server's
    2 s header timeout) and is closed; good traffic flows meanwhile."""
    host, port = fault_server.http_url.rsplit(":", 1)
    connections = []
    for _ in range(50):
        sock = socket.create_connection((host, int(port)), timeout=10)
        sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: slow\r\nX-Slow: ")
        sock.setblocking(False)
        connections.append(sock)
    answers: dict[int, bytes] = {}
    deadline = time.monotonic() + HANG_GUARD_S
    with good_traffic():
        while len(answers) < len(connections) and time.monotonic() < deadline:
            for index, sock in enumerate(connections):
                if index in answers:
                    continue
                try:
                    answers[index] = sock.recv(4096)  # the 408, or b"" once closed
                except BlockingIOError:
                    try:
                        sock.send(b"a")
                    except OSError:
                        answers[index] = b"closed"
            time.sleep(0.5)
    for sock in connections:
        sock.close()
    assert len(answers) == len(connections), f"{len(connections) - len(answers)} still open"
    assert all(a.startswith(b"HTTP/1.1 408") for a in answers.values()), set(answers.values())
    assert b'{"error": "request headers not complete within 2 s"}' in answers[0]


def test_startup_is_logged_in_one_line_not_a_traceback_per_poll(fault_server: TritonServer) -> None:
    log = fault_server.log_path.with_name("http_front.log").read_text()
    assert "Traceback" not in log
    assert log.count("is not answering") <= 1


@pytest.fixture
def front_without_triton(tmp_path: Path):
    """The HTTP front before a port nobody listens on: Triton down (or not started yet)."""
    port, upstream = free_ports(["127.0.0.1"] * 2)
    log_path = tmp_path / "http_front.log"
    with open(log_path, "wb") as log_file:
        front = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "server.fronts.http_front",
                f"--listen=127.0.0.1:{port}",
                f"--upstream=127.0.0.1:{upstream}",
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    deadline = time.monotonic() + HANG_GUARD_S
    while True:
        try:
            client.is_server_live()
            break
        except OSError:
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
    yield client, log_path
    front.terminate()
    front.wait(timeout=30)


def test_triton_down_is_a_json_503_logged_once(front_without_triton) -> None:
    client, log_path = front_without_triton
    for _ in range(20):
        with pytest.raises(InferenceServerException) as error:
            client.infer("trivial", trivial_inputs("http"))
        assert error.value.status() == "503"
        assert error.value.message().startswith(
            "tritonserver is not reachable (starting, restarting or down)"
        )
        assert not client.is_server_ready()
    log = log_path.read_text()
    assert log.count("is not answering") == 1 and "Traceback" not in log, log


@pytest.fixture(scope="module")
def small_repository(spec_data: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_small_repository(spec_data, tmp_path_factory.mktemp("front_repository"), pipeline=False)


def test_a_request_in_flight_when_triton_dies_gets_json(small_repository: Path, tmp_path: Path) -> None:
    """Triton stops answering (SIGSTOP) with a request in flight, then dies (SIGKILL): the request gets
    an answer tritonclient can read, a 502. The front outlives its dead server while the launcher that
    started it runs (a supervisor would restart the server behind it: fault matrix row 46) and exits
    when the launcher stops.

    "In flight" is seen, not slept for: the request's bytes wait in the receive queue of Triton's
    socket (``/proc/net/tcp``), more bytes than the front's own ``GET`` of the model's config. A request
    killed before it reached Triton would get the 503 of a server not reachable instead. However long a
    loaded host takes between the warm request and this one, this one is checked against the config the
    warm one fetched (fault matrix row 74); before, a gap over the front's 5 s config TTL sent it to ask
    the stopped Triton for the config, and it never reached Triton's socket."""
    options = ServerOptions(
        repository=small_repository, http_front=True, self_heal=False, startup_timeout_s=240, workdir=tmp_path
    )
    rows = 64  # a body of several KB: past any GET the front sends upstream of its own

    def bytes_waiting_at_triton(port: int) -> int:
        return max(waiting_at(port).values(), default=0)

    with TritonServer(options) as server:
        warm = httpclient.InferenceServerClient(server.http_url, network_timeout=HANG_GUARD_S)
        warm.infer("trivial", trivial_inputs("http", rows))  # the front has the model's config now
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=HANG_GUARD_S)
        outcome: list[BaseException] = []
        stop_every_thread(server.pid)

        def infer() -> None:
            try:
                client.infer("trivial", trivial_inputs("http", rows))
            except BaseException as error:
                outcome.append(error)

        caller = threading.Thread(target=infer)
        caller.start()
        deadline = time.monotonic() + HANG_GUARD_S
        while bytes_waiting_at_triton(server.triton_http_port) < 16 * rows * 4:  # its tensor's bytes alone
            assert time.monotonic() < deadline, "the request never reached tritonserver's socket"
            time.sleep(0.05)
        os.kill(server.pid, signal.SIGKILL)
        os.kill(server.pid, signal.SIGCONT)
        caller.join(HANG_GUARD_S)
        front = server.http_front
        assert front is not None
        assert front.poll() is None, "the front must keep answering while its launcher runs"
    assert front.wait(timeout=HANG_GUARD_S) is not None
    [error] = outcome
    assert isinstance(error, InferenceServerException), error
    assert (error.status(), error.message().split(" (")[0]) == (
        "502",
        "tritonserver did not answer the request",
    ), error


# every kind of route a HEAD may name: health, metadata, config, readiness, statistics, inference (405:
# POST only), and the shared-memory status the front answers itself
HEAD_ROUTES = [
    "/v2",
    "/v2/health/live",
    "/v2/health/ready",
    "/v2/models/trivial",
    "/v2/models/trivial/config",
    "/v2/models/trivial/ready",
    "/v2/models/stats",
    "/v2/models/nosuch/config",
    "/v2/models/trivial/infer",
    "/v2/systemsharedmemory/status",
]


@pytest.mark.parametrize("route", HEAD_ROUTES)
def test_a_head_is_answered_as_its_get_without_a_body(fault_server: TritonServer, route: str) -> None:
    """Fault matrix row 65. Triton 2.51 answers HEAD on every route with 405 and a body, which HTTP
    forbids; the front read that body as the next answer's status line and answered 502. A HEAD gets its
    GET's status, without a body, and the connection it came on goes on: a GET sent after it on the same
    connection is answered (a body after the HEAD's answer would be read as that GET's status line)."""
    host, port = fault_server.http_url.rsplit(":", 1)
    address = (host, int(port))
    head = raw_http.exchange(address, raw_http.Request("HEAD", route, []))
    get = raw_http.exchange(address, raw_http.Request("GET", route, []))
    assert (head.status, head.failure) == (get.status, "") and get.status < 500, (head, get)
    kept_alive = f"HEAD {route} HTTP/1.1\r\nHost: test\r\n\r\n".encode()
    then = b"GET /v2/health/live HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
    with socket.create_connection(address, timeout=HANG_GUARD_S) as sock:
        sock.sendall(kept_alive + then)
        received = b""
        while chunk := sock.recv(1 << 16):
            received += chunk
    head_answer, _, rest = received.partition(b"\r\n\r\n")
    assert head_answer.startswith(b"HTTP/1.1 %d " % get.status), received[:300]
    assert raw_http.reply_in(rest, ended=True)[0] == raw_http.HttpReply(200, b""), received[:600]


TRIVIAL_BODY = json.dumps(
    {"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}]}
)


@pytest.mark.parametrize(
    ("path", "declared", "first"),
    [
        ("/v2/models/trivial/infer", len(TRIVIAL_BODY), b"HTTP/1.1 100 Continue\r\n\r\n"),
        ("/v2/models/nosuch/infer", len(TRIVIAL_BODY), b"HTTP/1.1 404 "),  # refused from its headers
        ("/v2/models/trivial/infer", 10**8, b"HTTP/1.1 413 "),
    ],
)
def test_a_client_that_expects_100_continue_gets_it_or_its_refusal(
    fault_server: TritonServer, path: str, declared: int, first: bytes
) -> None:
    """Fault matrix row 66. A client that sends ``Expect: 100-continue`` waits for ``100 Continue``
    before it sends its body (curl does for a large body, for 1 s); the front never sent it, Triton
    does. It now comes once the headers passed every check they allow, and a request its headers
    already refuse gets its refusal instead, before its body is sent."""
    host, port = fault_server.http_url.rsplit(":", 1)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n"
        f"Connection: close\r\nContent-Length: {declared}\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=HANG_GUARD_S) as sock:
        sock.sendall(head)
        received = sock.recv(1 << 16)  # the body is not sent until an answer comes: none is a hang
        assert received.startswith(first), received[:200]
        if not first.startswith(b"HTTP/1.1 100"):
            return
        sock.sendall(TRIVIAL_BODY.encode())
        received = b""
        while chunk := sock.recv(1 << 16):
            received += chunk
    reply, _ = raw_http.reply_in(received, ended=True)
    assert reply is not None and reply.status == 200, received[:300]
    assert json.loads(reply.body)["outputs"][0]["data"] == [2.0] * 16


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "M-SEARCH", "CONNECT"])
@pytest.mark.parametrize("route", ["/v2/health/ready", "/v2/models/trivial/infer"])
def test_a_method_triton_does_not_serve_is_answered_405(
    fault_server: TritonServer, method: str, route: str
) -> None:
    """Fault matrix row 67. Triton's HTTP API serves GET and POST (and the front HEAD); Triton answers
    the other methods its parser knows with 405 and drops the connection on the rest (``M-SEARCH``),
    which the front answered 502. The front answers every other method 405 itself, in Triton's words."""
    host, port = fault_server.http_url.rsplit(":", 1)
    reply = raw_http.exchange((host, int(port)), raw_http.Request(method, route, [], TRIVIAL_BODY.encode()))
    assert (reply.status, reply.failure) == (405, ""), reply
    assert json.loads(reply.body) == {"error": "Method Not Allowed"}
