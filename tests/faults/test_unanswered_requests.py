"""Fault matrix rows 37–41: requests Triton never answers, and connections that hold a front's slots.

Before: ``INT64 [2^62, 0]`` with empty data passed both fronts (0 elements, 0 bytes) and Triton never
answered it; 260 of them held the HTTP front's 256 upstream connections for its 600 s timeout, even
after their clients hung up, and every HTTP request, health included, timed out for minutes. Over gRPC
the call was never answered; a stream whose first message was garbage hung; 300 connections that never
sent the HTTP/2 preface were held for good.
"""

from __future__ import annotations

import json
import os
import select
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from harness import exchange, trivial_inputs
from process_stop import stop_every_thread
from resilience_fixtures import build_small_repository
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException
from waiting_sockets import waiting_at

from server import ServerOptions, TritonServer
from server.ports import free_port
from server.stubs import server_stubs

pytestmark = pytest.mark.integration
ENCODER = "text_embedding_encoder"
INPUTS = ("input_ids", "attention_mask")
HUGE = 2**62
REFUSED = f"input 'input_ids' declares shape [{HUGE}, 0]: a dimension above 2147483647 fits no model"
HANG_GUARD_S = 60  # not a latency bound: how long a request may go unanswered before it counts as never
FLOOD = 300  # more than the HTTP front's 256 upstream connections
# the gRPC front closes a connection without its HTTP/2 handshake after 10 s; grpc's own default, 60 s
HALF_OPEN_CLOSED_WITHIN_S = 30
# ... with this GOAWAY, the sign that its handshake timer closed it: length, type 7, no flags, stream 0,
# then last stream 0, PROTOCOL_ERROR and the reason
NO_HANDSHAKE = b"no HTTP/2 handshake in time"
HANDSHAKE_GOAWAY = (
    struct.pack(">I", 8 + len(NO_HANDSHAKE))[1:] + struct.pack(">BBIII", 7, 0, 0, 0, 1) + NO_HANDSHAKE
)


def _live_stubs(server: TritonServer) -> set[int]:
    return {stub.pid for stub in server_stubs(server.pid or 0) if stub.alive}


def _never_answered_http() -> bytes:
    body = json.dumps(
        {"inputs": [{"name": n, "shape": [HUGE, 0], "datatype": "INT64", "data": []} for n in INPUTS]}
    ).encode()
    return (
        f"POST /v2/models/{ENCODER}/infer HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def _never_answered_grpc() -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=ENCODER, id="huge")
    for name in INPUTS:
        request.inputs.add(name=name, datatype="INT64", shape=[HUGE, 0])
        request.raw_input_contents.append(b"")
    return request


def test_a_flood_triton_never_answers_is_refused_while_http_serves(
    fault_server: TritonServer, good_traffic
) -> None:
    """300 ``[2^62, 0]`` requests, 32 at a time: each a 400 naming the input; health and good
    inference over both protocols answered throughout; no stub lost, the server's PID unchanged."""
    pid, stubs = fault_server.pid, _live_stubs(fault_server)
    raw = _never_answered_http()
    ready = b"GET /v2/health/ready HTTP/1.1\r\nHost: test\r\nContent-Length: 0\r\n\r\n"

    def one(_: int) -> tuple[int, dict]:  # raw sockets: a tritonclient client is not for threads
        [(status, body)] = exchange(fault_server, raw, timeout=HANG_GUARD_S)
        assert exchange(fault_server, ready, timeout=HANG_GUARD_S)[0][0] == 200
        return status, json.loads(body)

    with good_traffic(), ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(one, range(FLOOD)))
    assert answers == [(400, {"error": REFUSED})] * FLOOD
    assert fault_server.pid == pid and _live_stubs(fault_server) == stubs


def test_grpc_answers_the_shape_unary_and_on_a_stream(fault_server: TritonServer, good_traffic) -> None:
    with grpc.insecure_channel(fault_server.grpc_url) as channel, good_traffic():
        service = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as error:
            service.ModelInfer(_never_answered_grpc(), timeout=HANG_GUARD_S)
        assert (error.value.code(), error.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, REFUSED)
        [answer] = list(service.ModelStreamInfer(iter([_never_answered_grpc()]), timeout=HANG_GUARD_S))
    assert answer.error_message == REFUSED and answer.infer_response.id == "huge"


@pytest.mark.parametrize("garbage", [b"\xff\xff\xff\xff", b"\x0a\xff"])
def test_a_stream_whose_first_message_is_garbage_is_closed(
    fault_server: TritonServer, garbage: bytes
) -> None:
    with grpc.insecure_channel(fault_server.grpc_url) as channel:
        stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        with pytest.raises(grpc.RpcError) as error:
            list(stream(iter([garbage]), timeout=HANG_GUARD_S))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, error.value
    assert error.value.details().startswith("ModelStreamInfer: not a valid ModelInferRequest message")


def test_a_model_batch_above_its_config_is_refused_by_both_fronts(fault_server: TritonServer) -> None:
    """A shape the encoder's config does not allow (rank, batch) is refused before Triton, naming the
    input, in Triton's words."""
    for protocol, module in (("http", httpclient), ("grpc", grpcclient)):
        client = (
            httpclient.InferenceServerClient(fault_server.http_url)
            if protocol == "http"
            else grpcclient.InferenceServerClient(fault_server.grpc_url)
        )
        tensors = []
        for name in INPUTS:
            tensor = module.InferInput(name, [1, 1, 0], "INT64")
            tensor.set_data_from_numpy(np.zeros((1, 1, 0), np.int64))
            tensors.append(tensor)
        with pytest.raises(InferenceServerException) as error:
            client.infer(ENCODER, tensors)
        assert error.value.message().startswith(
            f"unexpected shape for input 'input_ids' for model '{ENCODER}'. Expected [-1,-1], got [1,1,0]"
        ), (protocol, error.value.message())


def test_half_open_http2_connections_are_closed(fault_server: TritonServer) -> None:
    """50 connections to the gRPC front that never finish the HTTP/2 preface: closed by the front's
    handshake timeout (10 s) while good calls are answered. Each must end with the GOAWAY of that
    timeout, within ``HALF_OPEN_CLOSED_WITHIN_S`` of the front's first bytes on it (its SETTINGS,
    sent as it takes the connection and starts the timer): the time a loaded host takes to accept
    50 connections is not counted against the front."""
    host, port = fault_server.grpc_url.rsplit(":", 1)
    connections, received, taken_at = [], {}, {}
    for number in range(50):
        sock = socket.create_connection((host, int(port)), timeout=HANG_GUARD_S)
        if number % 2:
            sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")  # the preface, no SETTINGS
        received[sock] = sock.recv(4096)  # the front's SETTINGS: it has taken the connection
        taken_at[sock] = time.monotonic()
        connections.append(sock)
    client = grpcclient.InferenceServerClient(fault_server.grpc_url)
    assert client.infer("trivial", trivial_inputs("grpc")).as_numpy("y").shape == (1, 16)
    open_for: dict[socket.socket, float] = {}
    deadline = time.monotonic() + HALF_OPEN_CLOSED_WITHIN_S + HANG_GUARD_S
    with selectors.DefaultSelector() as selector:
        for sock in connections:
            selector.register(sock, selectors.EVENT_READ)
        while len(open_for) < len(connections) and time.monotonic() < deadline:
            for key, _ in selector.select(timeout=max(0.0, deadline - time.monotonic())):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    data = sock.recv(4096)
                except OSError:
                    data = b""  # reset: closed as well
                received[sock] += data
                if not data:
                    selector.unregister(sock)
                    open_for[sock] = time.monotonic() - taken_at[sock]
    for sock in connections:
        sock.close()
    assert len(open_for) == len(connections), (
        f"{len(connections) - len(open_for)} of {len(connections)} half-open connections still open"
    )
    assert all(answer.endswith(HANDSHAKE_GOAWAY) for answer in received.values()), set(received.values())
    slowest = max(open_for.values())
    assert slowest <= HALF_OPEN_CLOSED_WITHIN_S, f"a half-open connection was closed after {slowest:.0f} s"


@pytest.fixture(scope="module")
def small_server(
    spec_data: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TritonServer]:
    repository = build_small_repository(
        spec_data, tmp_path_factory.mktemp("slots_repository"), pipeline=False
    )
    options = ServerOptions(
        repository=repository,
        self_heal=False,
        startup_timeout_s=240,
        workdir=tmp_path_factory.mktemp("slots"),
    )
    with TritonServer(options) as server:
        yield server


@pytest.fixture
def front_with_two_slots(small_server: TritonServer, tmp_path: Path) -> Iterator[int]:
    """An HTTP front before ``small_server``, where one client may have 2 requests upstream. A port
    taken between ``free_port()`` and the front's bind (by a server of a test beside this one) is left
    for another: the front is used only once its own log says it listens."""
    log_path = tmp_path / "http_front.log"
    deadline = time.monotonic() + HANG_GUARD_S
    while True:
        port = free_port()
        with open(log_path, "wb") as log_file:
            front = subprocess.Popen(
                [
                    sys.executable, "-m", "server.fronts.http_front", f"--listen=127.0.0.1:{port}",
                    f"--upstream={small_server.http_url}", "--max-client-requests=2",
                ],
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        while front.poll() is None and f"http front on 127.0.0.1:{port}" not in log_path.read_text():
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        if front.poll() is None:
            break
        assert time.monotonic() < deadline, log_path.read_text()  # exited: the port was taken; another
    yield port
    front.terminate()
    front.wait(timeout=30)


# a POST (which counts against the client's share) that changes nothing upstream: without the admin
# key, Triton refuses it (the front serves shared memory itself, so that API no longer reaches Triton)
STATUS = b"POST /v2/repository/index HTTP/1.1\r\nHost: test\r\nContent-Length: 0\r\n\r\n"


def _held_or_answer(port: int, triton_port: int, seen: set[str]) -> tuple[socket.socket, bytes]:
    """Send one request; the socket and its answer, or b"" once it is held upstream: a connection to
    the stopped Triton not among ``seen`` (which it joins) has bytes waiting, and no answer came."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=HANG_GUARD_S)
    sock.sendall(STATUS)
    deadline = time.monotonic() + HANG_GUARD_S
    while not select.select([sock], [], [], 0.05)[0]:
        if arrived := set(waiting_at(triton_port)) - seen:
            assert len(arrived) == 1, f"one request sent, {len(arrived)} arrived at tritonserver"
            seen |= arrived
            if not select.select([sock], [], [], 0)[0]:
                return sock, b""
            break
        assert time.monotonic() < deadline, "the request was neither answered nor forwarded to tritonserver"
    return sock, sock.recv(4096)


def _hold(port: int, triton_port: int, count: int, seen: set[str]) -> list[socket.socket]:
    """``count`` requests held upstream (a 429 meanwhile: a slot not freed yet, try again)."""
    held: list[socket.socket] = []
    deadline = time.monotonic() + HANG_GUARD_S
    while len(held) < count:
        assert time.monotonic() < deadline, "the client's slots were never freed"
        sock, answer = _held_or_answer(port, triton_port, seen)
        if answer:
            assert answer.startswith(b"HTTP/1.1 429"), answer
            sock.close()
            time.sleep(0.5)
        else:
            held.append(sock)
    return held


def test_one_client_holds_its_share_and_a_hang_up_frees_it(
    small_server: TritonServer, front_with_two_slots: int
) -> None:
    """Triton stops answering (SIGSTOP): a client's third request is refused at once with a JSON 429,
    not queued behind the two held; once it hangs up on those two, two more are forwarded (the
    upstream requests were cancelled: a repository POST runs no model, whereas an inference Triton
    has keeps its slot after a hang-up, ``test_http_hang_ups.py``), and a third is again a 429."""
    port, triton_port = front_with_two_slots, small_server.triton_http_port
    stop_every_thread(small_server.pid)
    seen = set(waiting_at(triton_port))  # not requests of this test
    held: list[socket.socket] = []
    try:
        held = _hold(port, triton_port, 2, seen)
        sock, answer = _held_or_answer(port, triton_port, seen)
        sock.close()
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 429"), answer or "held: forwarded to tritonserver, not refused"
        assert json.loads(body)["error"].startswith(
            "this client address (127.0.0.1) already has 2 requests waiting on tritonserver"
        )
        for sock in held:
            sock.close()  # the client hangs up
        held = _hold(port, triton_port, 2, seen)
        sock, answer = _held_or_answer(port, triton_port, seen)
        sock.close()
        assert answer.startswith(b"HTTP/1.1 429"), answer or "held: forwarded to tritonserver, not refused"
    finally:
        os.kill(small_server.pid, signal.SIGCONT)
    for sock in held:
        sock.settimeout(HANG_GUARD_S)
        answer = sock.recv(4096)  # Triton's own answer (a 403: the repository API is keyed)
        assert answer.startswith(b"HTTP/1.1 403"), (
            f"a held request was not answered once Triton was: {answer!r}"
        )
        sock.close()
    assert small_server.process is not None and small_server.process.poll() is None
