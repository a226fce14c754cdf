"""The soak's share attacks (fault matrix rows 38 and 78) without a server: which answers they accept,
how the report keeps what Triton held, and the raw clients' side of a hang-up and a reset, each on a
bare socket of the test's that only records what the client did. Their verdicts on a real server's
answers are tested in tests/faults/test_soak_attacks.py."""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

from server.fronts import h2c
from soak.attacks import ATTACKER, SHARE_REFUSAL, share_answer
from soak.raw_grpc import Answers, send_and_reset
from soak.raw_http import Request, hang_ups
from soak.report import SoakReport

SHARE_429 = f"this client address (127.0.0.9) already has 64 {SHARE_REFUSAL} (64 per address, 256 in all)"
OVERDUE = "model 'm' already has 64 requests past their deadline that tritonserver is still running"
NO_SLOT = "no slot of the 256 to tritonserver freed within 60 s; retry"


@pytest.mark.parametrize(
    ("status", "text", "right"),
    [
        (200, "", True),
        ("OK", "", True),
        (429, SHARE_429, True),
        ("RESOURCE_EXHAUSTED", SHARE_429.replace("address", "connection"), True),
        (429, OVERDUE, False),  # row 58's 429: another bound than the client's share
        ("RESOURCE_EXHAUSTED", NO_SLOT, False),
        (503, SHARE_429, False),
        ("UNAVAILABLE", "", False),
        (0, "", False),  # no answer: the connection ended without one
        ("", "", False),
    ],
)
def test_a_share_attack_takes_an_answer_or_its_shares_refusal_alone(
    status: int | str, text: str, right: bool
) -> None:
    assert share_answer(status, text) is right


def test_the_report_keeps_the_most_waiting_of_all_runs_beside_its_check() -> None:
    report = SoakReport(duration_s=60)
    what = "HTTP inferences hung up once sent"
    for most in (12.0, 61.0, 3.0):
        report.check(what).record(True)
        report.waited(what, most, 64, [8, 64])
    assert report.most_waiting == {what: (61.0, 64, [8, 64])}
    assert (
        f"  {what}: 3, answered right: 3; most of them waiting in tritonserver at once 61 (their share 64; "
        "each request 8 × 64 tokens)" in (report.text().splitlines())
    )


class _Listener:
    """A bare listening socket that records, per connection accepted (``connections`` of them), the
    client's address, the bytes it sent, and when it closed; ``answers`` are written back on the
    connections whose index they name."""

    def __init__(self, connections: int, answers: dict[int, bytes]) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.connections, self.answers = connections, answers
        self.peers, self.received, self.closed_at = [], [], []
        self.threads: list[threading.Thread] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> tuple[str, int]:
        return self.sock.getsockname()

    def _accept(self) -> None:
        for index in range(self.connections):
            connection, peer = self.sock.accept()
            self.peers.append(peer[0])
            self.received.append(b"")
            self.closed_at.append(None)
            thread = threading.Thread(target=self._serve, args=(index, connection), daemon=True)
            thread.start()
            self.threads.append(thread)

    def _serve(self, index: int, connection: socket.socket) -> None:
        with connection:
            if index in self.answers:
                connection.sendall(self.answers[index])
            while chunk := connection.recv(1 << 16):
                self.received[index] += chunk
            self.closed_at[index] = time.monotonic()


def test_hang_ups_send_the_request_on_connections_of_their_own_and_close_them_unanswered() -> None:
    """Four connections from ``ATTACKER``: the two the listener answers return their answers; every one
    carries the whole request and is closed by the client, the unanswered ones once ``after_s`` passed
    (the front then sees a hang-up)."""
    refusal = b'{"error":"share"}'
    answer = b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: %d\r\n\r\n%s" % (len(refusal), refusal)
    listener = _Listener(4, {1: answer, 3: answer})
    raw = Request("POST", "/v2/models/m/infer", [], b"{}").raw()
    started = time.monotonic()
    replies = hang_ups(listener.address, raw, 4, after_s=0.5, source=ATTACKER)
    for thread in listener.threads:
        thread.join(timeout=10)
    assert [(r.status, r.body) for r in replies] == [(429, refusal)] * 2
    assert listener.peers == [ATTACKER] * 4
    assert listener.received == [raw] * 4
    assert all(closed is not None for closed in listener.closed_at), listener.closed_at
    assert all(listener.closed_at[i] - started >= 0.5 for i in (0, 2)), "closed before after_s passed"


def _frames(sock: socket.socket, until: int, count: int = 1) -> list[tuple[int, int, int, bytes]]:
    """Frames read from ``sock`` until ``count`` of kind ``until``: (kind, flags, stream, payload) each."""
    frames, buffer = [], b""
    while sum(frame[0] == until for frame in frames) < count:
        buffer += sock.recv(1 << 16)
        while len(buffer) >= 9 and len(buffer) >= 9 + (length := int.from_bytes(buffer[:3], "big")):
            kind, flags, stream = struct.unpack_from(">BBI", buffer, 3)
            frames.append((kind, flags, stream & 0x7FFFFFFF, buffer[9 : 9 + length]))
            buffer = buffer[9 + length :]
    return frames


def test_calls_are_reset_once_a_ping_after_them_is_acknowledged_and_not_before() -> None:
    """``send_and_reset``: every call whole (its headers, then its data ending the stream), then a PING;
    nothing more until the PING's acknowledgement, then a ``CANCEL`` reset for each call (row 78)."""
    client, front = socket.socketpair()
    with client, front:
        answers = Answers(client)
        done = threading.Thread(
            target=send_and_reset, args=(answers, b"block", b"data", [1, 3, 5], 7, 10.0), daemon=True
        )
        done.start()
        sent = _frames(front, h2c.PING)
        front.settimeout(0.3)
        with pytest.raises(TimeoutError):  # nothing reset before the front acknowledged the PING
            front.recv(1)
        front.settimeout(10)
        front.sendall(h2c.frame(h2c.PING, h2c.ACK, 0, (7).to_bytes(8, "big")))
        resets = _frames(front, h2c.RST_STREAM, count=3)
        done.join(timeout=10)
    calls = [(h2c.HEADERS, h2c.END_HEADERS, s, b"block") for s in (1, 3, 5)]
    data = [(h2c.DATA, h2c.END_STREAM, s, b"data") for s in (1, 3, 5)]
    assert sent == [x for pair in zip(calls, data, strict=True) for x in pair] + [
        (h2c.PING, 0, 0, (7).to_bytes(8, "big"))
    ]
    assert resets == [(h2c.RST_STREAM, 0, s, h2c.CANCEL.to_bytes(4, "big")) for s in (1, 3, 5)]
    assert answers.pings == {7}


def test_hang_ups_where_nothing_listens_are_each_no_answer() -> None:
    """A connection the front never took is no answer, counted as such, not an error that ends the
    soak: its verdict is then wrong, as for any request the front dropped."""
    with socket.create_server(("127.0.0.1", 0)) as closed:
        address = closed.getsockname()
    replies = hang_ups(address, b"GET / HTTP/1.1\r\n\r\n", 3, after_s=0.1)
    assert [r.failure.split("(")[0] for r in replies] == ["closed: ConnectionRefusedError"] * 3, replies
