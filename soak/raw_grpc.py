"""gRPC calls written frame by frame, for what grpcio will not send: the invariant fuzz's wire faults, fault
matrix rows 69 and 70, and calls reset once the front read them (row 78). A call dropped with its
connection, reset or answered with ``GOAWAY`` is no answer, as over HTTP."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import unquote

import grpc
import hpack

from server.fronts import h2c

CODES = {code.value[0]: code.name for code in grpc.StatusCode}
STREAM = 1
FRAME = struct.Struct(">IBI")  # 24-bit length and 8-bit type, flags, stream id
ANSWER_GUARD_S = 120.0  # how long ``Answers.until`` waits before it gives up: a hang guard, not a bound


@dataclass(frozen=True)
class GrpcReply:
    """``code``: the status name (``INVALID_ARGUMENT``), empty with ``failure`` set when no answer came."""

    code: str
    message: str
    payload: bytes
    elapsed_s: float
    failure: str = ""


def call_headers(path: str, metadata: list[tuple[bytes, bytes]], timeout_s: float) -> bytes:
    """A call's request header block as grpcio writes it, with ``metadata`` sent as it is."""
    fixed = [
        (b":method", b"POST"), (b":scheme", b"http"), (b":path", path.encode()), (b":authority", b"fuzz"),
        (b"content-type", b"application/grpc"), (b"te", b"trailers"),
        (b"grpc-timeout", b"%dm" % int(timeout_s * 1000)),
    ]  # fmt: skip
    return h2c.encode_headers(fixed + metadata)


def status_name(status: bytes) -> str:
    """A ``grpc-status`` value's name (``b"8"``: ``RESOURCE_EXHAUSTED``); empty for none of gRPC's."""
    return CODES.get(int(status), "") if status.isdigit() else ""


def message(body: bytes, flag: int = 0) -> bytes:
    """``body`` as one length-prefixed message (``flag`` 1: compressed)."""
    return bytes([flag]) + len(body).to_bytes(4, "big") + body


def exchange(
    address: tuple[str, int], block: bytes, data: bytes, timeout_s: float, source: str = ""
) -> GrpcReply:
    """One call on a new connection (from the local address ``source``, if given), and its answer."""
    started = time.monotonic()
    deadline = started + timeout_s
    bind = (source, 0) if source else None
    try:
        with socket.create_connection(address, timeout=timeout_s, source_address=bind) as sock:
            frames = [
                h2c.PREFACE,
                h2c.settings_frame({}),
                h2c.frame(h2c.HEADERS, h2c.END_HEADERS, STREAM, block),
            ]
            for start in range(0, len(data), h2c.DEFAULT_FRAME):
                frames.append(h2c.frame(h2c.DATA, 0, STREAM, data[start : start + h2c.DEFAULT_FRAME]))
            frames.append(h2c.frame(h2c.DATA, h2c.END_STREAM, STREAM))
            sock.sendall(b"".join(frames))
            return _answer(sock, deadline, started)
    except OSError as error:
        return GrpcReply("", "", b"", time.monotonic() - started, f"connection failed: {error!r}")


def _answer(sock: socket.socket, deadline: float, started: float) -> GrpcReply:
    """The call's answer, or why none: its trailers, a ``GOAWAY``, or a reset before headers ends it."""
    answers = Answers(sock)

    def ended() -> bool:
        reset = STREAM in answers.resets and STREAM not in answers.headed
        return STREAM in answers.trailers or answers.goaway is not None or reset

    def failed(why: str) -> GrpcReply:
        return GrpcReply("", "", answers.data.get(STREAM, b""), time.monotonic() - started, why)

    try:
        answers.until(ended, deadline)
    except TimeoutError:
        return failed("no answer in time")
    except ConnectionError:
        return failed("connection closed before the call's status")
    if answers.goaway is not None:
        return failed(f"GOAWAY {answers.goaway[0]}: {answers.goaway[1]!r}")
    if STREAM not in answers.trailers:
        return failed(f"stream reset ({answers.resets[STREAM]})")
    status, text = answers.status(STREAM)
    if not status_name(status):
        return failed(f"trailers without a grpc-status: {status!r}")
    return GrpcReply(status_name(status), text, answers.data.get(STREAM, b""), time.monotonic() - started)


class Answers:
    """What the front sends on one raw connection, by stream: DATA bytes and the closing headers."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.decoder, self.buffer = sock, hpack.Decoder(), b""
        self.data: dict[int, bytes] = {}
        self.trailers: dict[int, dict[bytes, bytes]] = {}
        self.headed: set[int] = set()  # streams the front sent headers on
        self.resets: dict[int, int] = {}  # stream: RST_STREAM's code
        self.settings: dict[int, int] = {}
        self.goaway: tuple[int, bytes] | None = None  # its code and debug data
        self.pings: set[int] = set()  # the payloads of the PINGs the front acknowledged

    def status(self, stream: int) -> tuple[bytes, str]:
        fields = self.trailers[stream]
        return fields.get(b"grpc-status", b""), unquote(fields.get(b"grpc-message", b"").decode("latin-1"))

    def until(self, done: Callable[[], bool], deadline: float | None = None) -> None:
        """Read frames until ``done()``, checked after each frame (the frames after it wait for the next
        call); ``TimeoutError`` once ``deadline`` (``time.monotonic()``; default ``ANSWER_GUARD_S`` from
        now) passed, ``ConnectionError`` if the front closed the connection first."""
        deadline = time.monotonic() + ANSWER_GUARD_S if deadline is None else deadline
        while not done():
            length = int.from_bytes(self.buffer[:3], "big")
            if len(self.buffer) >= 9 + length:  # a whole frame
                head, flags, stream = FRAME.unpack_from(self.buffer)
                payload, self.buffer = self.buffer[9 : 9 + length], self.buffer[9 + length :]
                self._read(head & 0xFF, flags, stream & 0x7FFFFFFF, payload)
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no answer in time")
            self.sock.settimeout(remaining)
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError(f"the front closed the connection; answers so far {self.trailers}")
            self.buffer += chunk

    def _read(self, kind: int, flags: int, stream: int, payload: bytes) -> None:
        if kind == h2c.HEADERS:
            fields = dict(self.decoder.decode(payload, raw=True))
            self.headed.add(stream)
            if flags & h2c.END_STREAM:
                self.trailers[stream] = fields
        elif kind == h2c.DATA:
            self.data[stream] = self.data.get(stream, b"") + payload
        elif kind == h2c.RST_STREAM:
            self.resets[stream] = int.from_bytes(payload, "big")
        elif kind == h2c.GOAWAY:
            self.goaway = (int.from_bytes(payload[4:8], "big"), payload[8:])
        elif kind == h2c.PING and flags & h2c.ACK:
            self.pings.add(int.from_bytes(payload, "big"))
        elif kind == h2c.SETTINGS and not flags & h2c.ACK:
            self.settings.update(struct.iter_unpack(">HI", payload))
            self.sock.sendall(h2c.frame(h2c.SETTINGS, h2c.ACK, 0))


def send_and_reset(
    answers: Answers,
    block: bytes,
    data: bytes,
    streams: Sequence[int],
    ping: int,
    timeout_s: float,
    before_reset: Callable[[], object] | None = None,
) -> None:
    """A whole call on each of ``streams`` (``block``, then ``data`` ending it), each reset (``RST_STREAM``
    ``CANCEL``) as soon as a PING sent after them (``ping``: its payload) is acknowledged: the front has
    read them, so their handlers have begun (HTTP/2 "rapid reset", fault matrix row 78); after
    ``before_reset()`` returns, where given."""
    calls = [
        h2c.frame(h2c.HEADERS, h2c.END_HEADERS, s, block) + h2c.frame(h2c.DATA, h2c.END_STREAM, s, data)
        for s in streams
    ]
    answers.sock.sendall(b"".join(calls) + h2c.frame(h2c.PING, 0, 0, ping.to_bytes(8, "big")))
    answers.until(lambda: ping in answers.pings, time.monotonic() + timeout_s)
    if before_reset is not None:
        before_reset()
    cancel = h2c.CANCEL.to_bytes(4, "big")
    answers.sock.sendall(b"".join(h2c.frame(h2c.RST_STREAM, 0, s, cancel) for s in streams))
