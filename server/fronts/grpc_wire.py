"""gRPC over the front's own HTTP/2 (``h2c``): messages, ``grpc-timeout``, ``grpc-status``, and the calls
of a client's connection (``FrontConnection``, ``ServerCall``), with what the front holds for
clients bounded (fault matrix rows 20, 41, 69–71, 75, 77 and 78).
"""

from __future__ import annotations

import asyncio
import binascii
import logging
import re
import zlib
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import quote, unquote

import grpc

from server.fronts import h2c
from server.fronts.client_connections import (
    DEFAULT_SHARE,
    REFUSED_WAIT_S,
    AddressCounts,
    ClientConnections,
    close_after_answer,
    peer_address,
)
from server.fronts.client_slots import MESSAGE_TIMEOUT_S
from server.fronts.refusal_log import note_refusal

log = logging.getLogger(__name__)

Headers = list[tuple[bytes, bytes]]
STATUS = {code.name: code.value[0] for code in grpc.StatusCode}
OK, CANCELLED, UNKNOWN, INTERNAL, UNAVAILABLE = (
    STATUS[n] for n in ("OK", "CANCELLED", "UNKNOWN", "INTERNAL", "UNAVAILABLE")
)
RESOURCE_EXHAUSTED, UNIMPLEMENTED = STATUS["RESOURCE_EXHAUSTED"], STATUS["UNIMPLEMENTED"]
INVALID_ARGUMENT, DEADLINE_EXCEEDED = STATUS["INVALID_ARGUMENT"], STATUS["DEADLINE_EXCEEDED"]
# grpc-timeout units in seconds
TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
# messages still arriving are held up to this many of the largest (as the HTTP front's large bodies)
LARGE_MESSAGES = 4
PREFIX_BYTES = 5  # a message's compressed flag and 32-bit length
# a connection's calls at once (SETTINGS_MAX_CONCURRENT_STREAMS; more: REFUSED_STREAM, fault matrix row 77),
# far above a connection's slot share (32), which a client meets first
MAX_STREAMS = 1024
# calls open from one client address and on the whole front (row 77): without them 8,192 connections of
# 1,024 streams would take 22 GB; an address has at most 64 requests waiting, and the total is 44 MB
STREAMS_PER_ADDRESS = 2048
STREAMS_TOTAL = 16384
RESPONSE_HEADERS = [(b":status", b"200"), (b"content-type", b"application/grpc")]
RESPONSE_BLOCK = h2c.encode_headers(RESPONSE_HEADERS)
OK_TRAILERS = h2c.encode_headers([(b"grpc-status", b"0")])
OK_ALONE = RESPONSE_BLOCK + OK_TRAILERS  # trailers-only
# gRPC's metadata grammar (fault matrix row 69); values of names ending in -bin are base64
METADATA_NAME = re.compile(rb"[0-9a-z_.-]+")
ASCII_VALUE = re.compile(rb"[\x20-\x7e]*")
# counted as HPACK does (+32 a field): Triton refuses at random above 8 KiB, and the front adds its own
MAX_METADATA_BYTES = 4 << 10
FIELD_OVERHEAD = 32


def metadata_fault(headers: list[tuple[bytes, bytes]]) -> str | None:
    """Why Triton's gRPC would not take the call's metadata (None: it would)."""
    size = 0
    for name, value in headers:
        if name.startswith(b":"):
            continue
        size += len(name) + len(value) + FIELD_OVERHEAD
        shown = name.decode("latin-1")
        if not METADATA_NAME.fullmatch(name):
            return f"metadata name {shown!r} is not gRPC's: lower-case letters, digits, '_', '-' and '.' only"
        if name.endswith(b"-bin"):
            if not _is_base64(value):
                return f"metadata '{shown}' ends in -bin but its value is not base64"
        elif not ASCII_VALUE.fullmatch(value):
            return f"metadata '{shown}' holds a byte outside printable ASCII (0x20-0x7E); send it as -bin"
    if size > MAX_METADATA_BYTES:
        return f"the call's metadata takes {size} bytes, above the {MAX_METADATA_BYTES} the front forwards"
    return None


def _is_base64(value: bytes) -> bool:
    try:  # strict: refuses a length of 4n + 1 too
        binascii.a2b_base64(value + b"=" * (-len(value) % 4), strict_mode=True)
    except binascii.Error:
        return False
    return True


class GrpcError(Exception):
    """A call ends with this status (``code``: gRPC's number), ``details`` and trailing metadata."""

    def __init__(self, code: int, details: str, trailing: Headers | None = None) -> None:
        super().__init__(details)
        self.code, self.details, self.trailing = code, details, trailing or []


def parse_timeout(value: bytes) -> float | None:
    """A ``grpc-timeout`` header in seconds (None when malformed: the call then has no deadline)."""
    unit = TIMEOUT_UNITS.get(value[-1:])
    digits = value[:-1]
    if unit is None or not digits.isdigit() or len(digits) > 8:
        return None
    return int(digits) * unit


def format_timeout(seconds: float) -> bytes:
    """Seconds as a ``grpc-timeout`` header (milliseconds, at least one; at most 8 digits)."""
    return b"%dm" % min(max(1, int(seconds * 1000)), 99_999_999)


def frame_message(message: bytes) -> bytes:
    return b"\x00" + len(message).to_bytes(4, "big") + message


def status_headers(code: int, details: str, trailing: Headers) -> Headers:
    headers = [(b"grpc-status", str(code).encode())]
    if details:
        headers.append((b"grpc-message", quote(details, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~").encode()))
    return headers + trailing


def read_status(headers: Headers) -> tuple[int, str, Headers]:
    """(code, details, trailing metadata) of a call's trailers."""
    code, details, trailing = UNKNOWN, "", []
    for name, value in headers:
        if name == b"grpc-status":
            code = int(value) if value.isdigit() else UNKNOWN
        elif name == b"grpc-message":
            details = unquote(value.decode("latin-1"))
        elif not name.startswith(b":") and name != b"content-type":
            trailing.append((name, value))
    return code, details, trailing


class MessageReader:
    """Whole messages out of DATA frames; one above ``limit`` is refused from its prefix."""

    def __init__(self, limit: int, encoding: bytes | None = None) -> None:
        self.limit, self.encoding = limit, encoding
        self.pending = bytearray()

    def feed(self, data: bytes) -> list[tuple[bytes, int]]:
        """The messages completed by ``data``, each with its size on the wire."""
        pending = self.pending
        if not pending and len(data) >= PREFIX_BYTES:
            length = int.from_bytes(data[1:5], "big")
            if length + PREFIX_BYTES == len(data) and length <= self.limit and not data[0]:
                return [(data[PREFIX_BYTES:], len(data))]  # one whole message in one frame
        pending += data
        messages = []
        while len(pending) >= PREFIX_BYTES:
            length = int.from_bytes(pending[1:5], "big")
            if length > self.limit:
                raise GrpcError(
                    RESOURCE_EXHAUSTED, f"Received message larger than max ({length} vs. {self.limit})"
                )
            if len(pending) < PREFIX_BYTES + length:
                break
            message = bytes(pending[PREFIX_BYTES : PREFIX_BYTES + length])
            if pending[0]:
                message = self._decompress(message)
            messages.append((message, PREFIX_BYTES + length))
            del pending[: PREFIX_BYTES + length]
        return messages

    def _decompress(self, message: bytes) -> bytes:
        """A compressed message (``grpc-encoding`` gzip or deflate), bounded by ``limit`` unpacked."""
        if self.encoding not in (b"gzip", b"deflate"):
            raise GrpcError(
                UNIMPLEMENTED, f"a compressed message in encoding {self.encoding!r}: only gzip and deflate"
            )
        unpacker = zlib.decompressobj(zlib.MAX_WBITS | 16 if self.encoding == b"gzip" else zlib.MAX_WBITS)
        try:
            plain = unpacker.decompress(message, self.limit + 1)
        except zlib.error as error:
            raise GrpcError(
                INVALID_ARGUMENT, f"a compressed message that does not decompress: {error}"
            ) from error
        if len(plain) > self.limit:
            raise GrpcError(RESOURCE_EXHAUSTED, f"a message above {self.limit} bytes once decompressed")
        return plain


class ServerCall:
    """One call of a client, as the front's handler sees it."""

    def __init__(
        self, connection: FrontConnection, stream_id: int, method: str, headers: Headers, streaming: bool
    ) -> None:
        self.connection, self.stream_id = connection, stream_id
        self.method, self.streaming = method, streaming
        self.metadata: Headers = []
        self.deadline: float | None = None
        encoding = None
        for name, value in headers:
            if name == b"grpc-timeout":
                timeout = parse_timeout(value)
                self.deadline = None if timeout is None else connection.loop.time() + timeout
            elif name == b"grpc-encoding":
                encoding = None if value == b"identity" else value
            if not name.startswith(b":"):
                self.metadata.append((name, value))
        limits = connection.front_limits
        self.reader = MessageReader(limits.max_message_bytes, encoding)
        self.messages: deque[tuple[bytes, int]] = deque()
        self.queued = 0  # bytes of the messages waiting for the handler
        self.withheld = 0  # bytes received and not yet given back as window
        self.ended = False  # the client sent all it will
        self.waiter: asyncio.Future | None = None
        self.task: asyncio.Task | None = None
        # the handler handed the call to Triton, which runs it whatever the client does after: a reset
        # no longer cancels the handler, which waits for Triton's answer (fault matrix row 78)
        self.forwarded = False
        self.headers_sent = False
        self.done = False
        self.held = 0  # bytes of this call's messages counted in the front's ``IncomingBytes``
        # a message must be whole in time, as an HTTP body must: a unary call's from the call's start
        # (fault matrix row 71), each of a stream's from its first byte (row 75); a stream's first byte
        # must come within the connection's idle time: until then it has no handler and no slot, yet
        # keeps its connection from idling (row 77)
        self.timer: asyncio.TimerHandle | None = None
        self._time_message(limits.idle_s if streaming else limits.message_s)

    def on_data(self, data: bytes, end_stream: bool) -> None:
        """DATA from the client (``end_stream``: its last)."""
        if self.done:
            return
        try:
            messages = self.reader.feed(data) if data else []
        except GrpcError as error:  # before the rest of the message is buffered
            self.abort(error.code, error.details)
            return
        self.messages.extend(messages)
        self.queued += sum(size for _, size in messages)
        if self.streaming:
            if messages or not self.reader.pending or self.task is None:  # whole, or the stream's first
                self._stop_timer()
            if self.reader.pending and self.timer is None:  # a message begins
                self._time_message()
        if not self._hold():
            return
        self._give_window(len(data))
        if end_stream:
            self.ended = True
            if self.reader.pending:
                self.abort(INVALID_ARGUMENT, "the call ended inside a message (its length prefix says more)")
                return
        if self.task is None and (self.streaming or self.ended):
            if not self.streaming:  # its message is the handler's now
                self.release()
            self.task = asyncio.ensure_future(self.connection.front_serve(self))
            self.task.add_done_callback(self._served)
        if self.waiter is not None and not self.waiter.done() and (messages or end_stream):
            self.waiter.set_result(None)

    def message(self) -> bytes:
        """The one message of a unary call."""
        if len(self.messages) != 1:
            raise GrpcError(
                INVALID_ARGUMENT, f"a unary call carries one message, this one {len(self.messages)}"
            )
        return self.messages[0][0]

    async def receive(self) -> bytes | None:
        """The next message of a stream; None once the client has sent its last."""
        while not self.messages:
            if self.ended:
                return None
            self.waiter = self.connection.loop.create_future()
            await self.waiter
            self.waiter = None
        message, size = self.messages.popleft()
        self.queued -= size
        self._hold()
        self._give_window(0)
        return message

    def _hold(self) -> bool:
        """Count what the call holds; refuse it above the ``IncomingBytes`` bound (False)."""
        held = (
            0
            if self.done
            else len(self.reader.pending) + (self.queued if self.streaming or not self.task else 0)
        )
        incoming = self.connection.front_limits.incoming
        incoming.held += held - self.held
        self.held = held
        if held and incoming.held > incoming.limit:
            note_refusal(
                "calls beyond the message bytes the front holds (RESOURCE_EXHAUSTED, fault matrix row 71)",
                self.connection.address,
            )
            self.abort(
                RESOURCE_EXHAUSTED,
                f"the front already holds {incoming.held - held} bytes of its clients' messages still "
                f"arriving or waiting, at most {incoming.limit}; send this call when those are taken",
            )
            return False
        return True

    def release(self) -> None:
        """This call's messages are no longer the front's to count (taken, or the call ended)."""
        self.connection.front_limits.incoming.held -= self.held
        self.held = 0
        self._stop_timer()
        if self.done:  # its bytes go now: a stream's handler task and this call keep each other alive
            self.reader.pending = bytearray()
            self.messages.clear()

    def _time_message(self, seconds: float | None = None) -> None:
        limit = self.connection.front_limits.message_s if seconds is None else seconds
        self.timer = self.connection.loop.call_later(limit, self._message_late)

    def _stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _message_late(self) -> None:
        self.timer = None
        if self.ended or self.done:
            return
        if self.withheld:  # the front holds back the stream's window: the rest cannot come yet
            self._time_message()
            return
        limits = self.connection.front_limits
        if self.streaming and self.task is None:  # its headers alone (row 77)
            bound = "streams without a message in the idle time (DEADLINE_EXCEEDED, fault matrix row 77)"
            details = f"the stream sent no message within {limits.idle_s:g} s of its start"
        else:
            bound = "messages not whole in the message time (DEADLINE_EXCEEDED, fault matrix rows 71, 75)"
            late = "a message of this stream" if self.streaming else "the call's message"
            since = " of its first byte" if self.streaming else ""
            details = f"{late} was not complete within {limits.message_s:g} s{since}"
        note_refusal(bound, self.connection.address)
        # the call ends and its handler with it: a stream's slot and Triton stream are freed
        self.abort(DEADLINE_EXCEEDED, details)

    def _give_window(self, received: int) -> None:
        """Let the client send more while what waits for the handler stays under one stream window."""
        self.withheld += received
        if self.withheld and (not self.streaming or self.queued <= h2c.STREAM_WINDOW):
            self.connection.consumed(self.stream_id, self.withheld)
            self.withheld = 0

    def send_message(self, message: bytes, initial: Headers = ()) -> None:
        """A message of the answer, after its headers (with ``initial`` metadata) if they were not sent."""
        if self.done:
            return
        if not self.headers_sent:
            self.headers_sent = True
            block = h2c.encode_headers(RESPONSE_HEADERS + list(initial)) if initial else RESPONSE_BLOCK
            self.connection.send_headers(self.stream_id, block)
        self.connection.send_data(self.stream_id, frame_message(message))

    def reply(self, message: bytes, initial: Headers = (), trailing: Headers = ()) -> None:
        """A unary call's answer: headers, the message and OK trailers, in one write."""
        self.send_message(message, initial)
        self.finish(OK, "", list(trailing))

    def finish(self, code: int, details: str = "", trailing: Headers | None = None) -> None:
        """End the call with this status (trailers, or trailers alone when nothing was sent)."""
        if self.done:
            return
        self.done = True
        if code == OK and not details and not trailing:
            block = OK_TRAILERS if self.headers_sent else OK_ALONE
        else:
            status = status_headers(code, details, trailing or [])
            block = h2c.encode_headers(status if self.headers_sent else RESPONSE_HEADERS + status)
        connection = self.connection
        connection.send_headers(self.stream_id, block, end_stream=True)
        if not self.ended and self.stream_id not in connection.sending:
            # the client may stop sending (gRPC: RST_STREAM NO_ERROR after the trailers), unless the
            # trailers still wait for window: then the client ends the stream once it has them
            connection.reset(self.stream_id, h2c.NO_ERROR)
        connection.call_ended(self)

    def abort(self, code: int, details: str) -> None:
        """End the call with this status and cancel its handler."""
        self.finish(code, details)
        if self.task is not None:
            self.task.cancel()

    def on_reset(self, code: int = h2c.CANCEL) -> None:
        """The client reset the call or went away: its handler is cancelled unless it ``forwarded`` the call
        (Triton runs it anyway), and the call is counted (row 77) until its handler has ended (row 78)."""
        self.done = True
        if self.task is None or self.task.done():
            self.connection.call_ended(self)
            return
        self.release()  # what it sent and the handler has not taken is dropped
        if not self.forwarded:
            self.task.cancel()
            return
        self.ended = True  # a stream's handler forwards nothing more and waits for Triton's last answer
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def _served(self, task: asyncio.Task) -> None:
        if task.cancelled():
            if not self.done:
                self.connection.reset(self.stream_id, h2c.CANCEL)
                self.done = True
        elif isinstance(error := task.exception(), GrpcError):
            self.finish(error.code, error.details, error.trailing)
        elif error is not None:
            log.error("the gRPC front failed on a %s call", self.method, exc_info=error)
            self.finish(INTERNAL, f"the front failed: {error!r}")
        else:
            self.finish(OK)
        self.connection.call_ended(self)  # a call reset meanwhile leaves its place only now (row 78)


class IncomingBytes:
    """Bytes of messages held before a handler takes them, over all connections (row 71)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.held = limit, 0


@dataclass(frozen=True)
class ConnectionLimits:
    max_message_bytes: int
    handshake_s: float
    idle_s: float
    incoming: IncomingBytes  # the front's, shared by its connections
    # the front's count of connections by client address (fault matrix row 73)
    clients: ClientConnections = field(default_factory=lambda: ClientConnections(DEFAULT_SHARE))
    message_s: float = MESSAGE_TIMEOUT_S  # a message must be whole within this (rows 71, 75)
    # the front's calls open, shared by its connections (row 77)
    streams: AddressCounts = field(default_factory=lambda: AddressCounts(STREAMS_PER_ADDRESS, STREAMS_TOTAL))


class FrontConnection(h2c.Endpoint):
    """A client's HTTP/2 connection to the front; ``serve(call)`` handles each call."""

    def __init__(
        self,
        limits: ConnectionLimits,
        methods: dict[str, bool],
        prefix: str,
        serve: Callable[[ServerCall], Awaitable[None]],
        connections: set[FrontConnection],
    ) -> None:
        super().__init__(
            {
                h2c.MAX_CONCURRENT_STREAMS: MAX_STREAMS,
                h2c.INITIAL_WINDOW_SIZE: h2c.STREAM_WINDOW,
                h2c.MAX_HEADER_LIST_SIZE: h2c.MAX_HEADER_LIST,
            }
        )
        self.front_limits, self.methods, self.prefix = limits, methods, prefix.encode()
        self.front_serve, self.connections = serve, connections
        self.last_stream = 0
        self.address = self.name = ""  # the client's: ``127.0.0.1``, ``ipv4:127.0.0.1:54321``
        self.handshaken = False
        self.refusal = ""  # beyond the client's share of connections (row 73): its first call's answer
        self.stopping = False
        self.idle_since = 0.0
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        self.address = self.name = peer_address(peer)
        if isinstance(peer, tuple) and len(peer) >= 2:
            host, port = peer[0], peer[1]
            self.name = f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"
        refusal = self.front_limits.clients.admit(self.address)
        if refusal is not None:
            self._refused(refusal)
            return
        self.connections.add(self)
        self.timer = self.loop.call_later(self.front_limits.handshake_s, self._handshake_expired)

    def pause_writing(self) -> None:
        """A client that does not read its answers is not read either (fault matrix row 70)."""
        if not self.closed and self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if not self.closed and self.transport is not None:
            self.transport.resume_reading()

    def _handshake_expired(self) -> None:
        if not self.handshaken:
            note_refusal(
                "connections without an HTTP/2 handshake in time (closed, fault matrix row 41)", self.address
            )
            log.debug("closing %s: no HTTP/2 handshake within %g s", self.name, self.front_limits.handshake_s)
            self.close(h2c.PROTOCOL_ERROR, "no HTTP/2 handshake in time")

    def _refused(self, refusal: str) -> None:
        """Row 73: its first call gets ``RESOURCE_EXHAUSTED`` with ``refusal``, then ``GOAWAY`` (alone after
        ``REFUSED_WAIT_S`` without a call); one beyond the refused that may wait is closed now."""
        log.debug("refusing a connection from %s: %s", self.name, refusal)
        self.refusal = refusal
        if not self.front_limits.clients.wait_refused(self):
            self.closed = True
            self.transport.abort()
            return
        self.timer = self.loop.call_later(REFUSED_WAIT_S, self._end_refused, h2c.ENHANCE_YOUR_CALM)

    def _end_refused(self, code: int) -> None:
        self.write(h2c.goaway(self.last_stream, code, self.refusal.encode()))
        self._flush()
        self.closed = True
        close_after_answer(self.transport)

    def on_settings(self) -> None:
        if not self.handshaken:
            self.handshaken = True
            if self.refusal:
                return
            if self.timer is not None:
                self.timer.cancel()
            self.idle_since = self.loop.time()
            self.timer = self.loop.call_later(self.front_limits.idle_s, self._idle_check)

    def _idle_check(self) -> None:
        idle_for = self.loop.time() - self.idle_since
        if not self.calls and idle_for >= self.front_limits.idle_s:
            self.close(h2c.NO_ERROR, "idle", self.last_stream)
            return
        wait = self.front_limits.idle_s - (0 if self.calls else idle_for)
        self.timer = self.loop.call_later(max(wait, 1.0), self._idle_check)

    def on_headers(self, stream_id: int, headers: Headers, end_stream: bool) -> None:
        call = self.calls.get(stream_id)
        if call is not None and not call.done:  # trailers from the client: its side ends
            call.on_data(b"", True)
            return
        if not self.handshaken or stream_id % 2 == 0:
            raise h2c.ProtocolError(h2c.PROTOCOL_ERROR, f"a client stream of id {stream_id}")
        if stream_id <= self.last_stream:
            if any(name == b":method" for name, _ in headers):  # a new call on a used id: never answered
                raise h2c.ProtocolError(
                    h2c.PROTOCOL_ERROR, f"a new stream of id {stream_id} after {self.last_stream}"
                )
            return  # trailers of a call the front has ended already
        self.last_stream = stream_id
        if self.refusal:
            self._refuse(stream_id, end_stream, RESOURCE_EXHAUSTED, self.refusal)
            if self.timer is not None:
                self.timer.cancel()
            self._end_refused(h2c.NO_ERROR)
            return
        if self.stopping or len(self.calls) >= MAX_STREAMS:  # RFC 9113 §5.1.2; fault matrix row 77
            if not self.stopping:
                note_refusal(
                    f"calls beyond its connection's {MAX_STREAMS} open (REFUSED_STREAM, fault matrix row 77)",
                    self.address,
                )
            self.reset(stream_id, h2c.REFUSED_STREAM)
            return
        path = next((value for name, value in headers if name == b":path"), b"")
        method = path[len(self.prefix) :].decode("latin-1") if path.startswith(self.prefix) else ""
        streaming = self.methods.get(method)
        if streaming is None:
            self._refuse(stream_id, end_stream, UNIMPLEMENTED, f"Method not found: {path.decode('latin-1')}")
            return
        fault = metadata_fault(headers)  # Triton would reset the call, or refuse it at random
        if fault is not None:
            self._refuse(stream_id, end_stream, INVALID_ARGUMENT, fault)
            return
        if self.queued > self.front_limits.max_message_bytes:
            note_refusal(
                "calls while its answers wait for its HTTP/2 window (RESOURCE_EXHAUSTED, fault matrix "
                "row 70)",
                self.address,
            )
            self._refuse(
                stream_id,
                end_stream,
                RESOURCE_EXHAUSTED,
                f"{self.queued} bytes of answers on this connection wait for the client's HTTP/2 window; "
                "read them (send WINDOW_UPDATE) before starting more calls",
            )
            return
        streams = self.front_limits.streams
        if not streams.take(self.address):  # the front's calls, in all (row 77)
            bound = streams.bound_met(self.address)
            note_refusal(f"calls open beyond {bound} (REFUSED_STREAM, fault matrix row 77)", self.address)
            self.reset(stream_id, h2c.REFUSED_STREAM)
            return
        call = ServerCall(self, stream_id, method, headers, streaming)
        self.calls[stream_id] = call
        self.open_stream(stream_id)
        if end_stream:
            call.on_data(b"", True)

    def _refuse(self, stream_id: int, end_stream: bool, code: int, details: str) -> None:
        """Answer a call the front does not take with ``code`` alone (trailers-only)."""
        block = h2c.encode_headers(RESPONSE_HEADERS + status_headers(code, details, []))
        self.send_headers(stream_id, block, end_stream=True)
        if not end_stream:
            self.reset(stream_id, h2c.NO_ERROR)

    def close_gracefully(self) -> None:
        """``GOAWAY``: the calls begun so far finish, the client opens new ones elsewhere."""
        self.stopping = True
        self.write(h2c.goaway(self.last_stream, h2c.NO_ERROR))

    def on_goaway(self, last_stream: int, code: int, debug: bytes) -> None:
        if code != h2c.NO_ERROR:
            log.debug("%s sent GOAWAY %d: %r", self.name, code, debug[:100])

    def call_ended(self, call: ServerCall) -> None:
        call.release()
        if self.calls.pop(call.stream_id, None) is not None:
            self.front_limits.streams.release(self.address)
        self.stream_received.pop(call.stream_id, None)
        if not self.calls:
            self.idle_since = self.loop.time()

    def on_closed(self, error: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.refusal:
            self.front_limits.clients.refused_gone(self)
            return
        self.front_limits.clients.release(self.address)
        self.connections.discard(self)
        for call in list(self.calls.values()):
            call.on_reset()
