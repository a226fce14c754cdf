"""Fault matrix row 38: HTTP clients that send an inference and hang up before its answer.

Triton 2.51's HTTP frontend runs a request whose connection closed, so the HTTP front cancelling its
upstream request on a hang-up only hid the work: one client address that sent 1,000 requests to a slow
model, each on a connection of its own closed once Triton had it, left 999 of them waiting in Triton at
once, no share applying; asking 50 ms each and closed 20 ms after sending, Triton ran 997 of 1,000.
Now a forwarded inference keeps its client's slot until Triton answers it or its deadline passes, and the
client's requests beyond its share are refused.
"""

from __future__ import annotations

import json
import select
import socket
import time
import urllib.error
from collections.abc import Iterator
from typing import Any

import pytest
from slow_model import SLOW, slow_model_server

from server import TritonServer
from server.fronts.client_slots import SlotLimits
from soak.attacks import PendingWatch, pending
from soak.raw_http import HttpReply, reply_in

pytestmark = pytest.mark.integration
HANG_UPS = 1000
SLOW_ASKS_S = 60.0  # what a hung-up request asks of ``slow`` (its most): it waits in Triton for the test
DEADLINE_S = 600.0  # ``slow``'s deadline: no slot is freed by it while the test runs
HANG_GUARD_S = 60.0  # how long an answer may take before it counts as never: not a latency bound
# how long the client waits for its request to reach Triton before it hangs up anyway (only the one
# ``slow`` runs at once is never counted waiting): a pace, never asserted
FORWARD_GUARD_S = 10.0
OTHER_EVERY = 100  # another client's request after this many hang-ups


def _post(path: str, document: dict) -> bytes:
    body = json.dumps(document).encode()
    return (
        f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def _slow(seconds: float) -> bytes:
    return _post(
        f"/v2/models/{SLOW}/infer",
        {"inputs": [{"name": "seconds", "shape": [1, 1], "datatype": "FP32", "data": [seconds]}]},
    )


TRIVIAL = _post(
    "/v2/models/trivial/infer",
    {"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}]},
)
SHARE_REFUSAL = "this client address (127.0.0.1) already has 64 requests waiting on tritonserver"


@pytest.fixture(scope="module")
def slow_server(
    spec_data: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TritonServer]:
    """``tests/faults/slow_model.py``'s server, behind the HTTP front."""
    with slow_model_server(spec_data, tmp_path_factory, "hang_up", DEADLINE_S, http_front=True) as running:
        yield running


def _front(server: TritonServer) -> tuple[str, int]:
    host, port = server.http_url.rsplit(":", 1)
    return host, int(port)


def _reply(sock: socket.socket) -> HttpReply:
    received = b""
    while True:
        chunk = sock.recv(1 << 16)
        received += chunk
        reply, _ = reply_in(received, not chunk)
        if reply is not None:
            return reply


def _ask(server: TritonServer, raw: bytes, source: str) -> HttpReply:
    """One request from the loopback address ``source`` on a connection of its own, and its answer."""
    with socket.create_connection(_front(server), HANG_GUARD_S, source_address=(source, 0)) as sock:
        sock.sendall(raw)
        return _reply(sock)


def _answered_right(reply: HttpReply) -> bool:
    """``trivial`` answered a request of ones with twos."""
    return reply.status == 200 and json.loads(reply.body)["outputs"][0]["data"] == [2.0] * 16


def _waiting(server: TritonServer) -> float:
    try:
        return pending(server.metrics_url, SLOW)
    except (urllib.error.URLError, OSError):
        return -1.0  # no read this time: the next one tells


def _send_and_hang_up(server: TritonServer, raw: bytes) -> HttpReply | None:
    """Send ``raw`` on a connection of its own and close it once the front answered or Triton has one
    more ``slow`` request waiting (or ``FORWARD_GUARD_S`` passed): the answer, or None when the client
    hung up without one."""
    before = _waiting(server)
    with socket.create_connection(_front(server), HANG_GUARD_S) as sock:
        sock.sendall(raw)
        give_up = time.monotonic() + FORWARD_GUARD_S
        while time.monotonic() < give_up:
            if select.select([sock], [], [], 0.01)[0]:
                return _reply(sock)
            if _waiting(server) > before >= 0:
                return None  # Triton has it: the client hangs up
    return None


def test_clients_that_hang_up_leave_triton_no_more_than_their_share(slow_server: TritonServer) -> None:
    """Row 38: one client address sends 1,000 inferences to ``slow`` asking a minute each, each on a
    connection of its own that it closes as soon as Triton has the request waiting (or the front answered
    it). Triton never has more of them waiting than the address's share (64, one of them running): a
    forwarded request keeps its slot until Triton answers it, and the requests beyond the share are
    refused 429. Another client's requests are answered, right, throughout (before: each hang-up freed
    the slot at once while Triton kept the request, and Triton had hundreds of them waiting)."""
    share = SlotLimits().per_address
    assert _ask(slow_server, _slow(0.0), "127.0.0.1").status == 200  # the front has the model's config
    refused, others = [], []
    with PendingWatch(slow_server.metrics_url, SLOW) as watch:
        for number in range(HANG_UPS):
            answer = _send_and_hang_up(slow_server, _slow(SLOW_ASKS_S))
            if answer is not None:
                refused.append((answer.status, json.loads(answer.body)["error"][: len(SHARE_REFUSAL)]))
            if number % OTHER_EVERY == 0:
                other = _ask(slow_server, TRIVIAL, "127.0.0.2")
                others.append("right" if _answered_right(other) else other)
        watch.read_again()
    assert others == ["right"] * len(others), others
    assert watch.reads > 0, "Triton's metrics never answered during the hang-ups"
    assert watch.most > 0, "no hung-up request reached Triton: the loop tested nothing"
    # the share bounds what Triton holds; its waiting count alone can reach it for an instant: a call whose
    # answer the front has passed on frees its slot before Triton takes the next one from its queue
    assert watch.most <= share, f"Triton had {watch.most:g} hung-up requests waiting (share {share})"
    assert refused, "none of the requests beyond the client's share was refused"
    assert set(refused) == {(429, SHARE_REFUSAL)}, set(refused)
