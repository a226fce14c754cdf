"""HTTP/2 over cleartext (prior knowledge) for both ends of the gRPC front: frames, flow control and
header blocks (``hpack`` decodes them). Neither grpc.aio nor the ``h2`` library: their per-call work
costs more CPU than this whole front (``scripts/h2_library_cost.py``).
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import hpack
from hpack.exceptions import HPACKError
from hpack.hpack import encode_integer

log = logging.getLogger(__name__)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# frame types
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    range(10)
)
# flags
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
# settings
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE = 1, 2, 3, 4, 5
MAX_HEADER_LIST_SIZE = 6
# error codes
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0, 1, 2, 3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 5, 6, 7, 8, 9
ENHANCE_YOUR_CALM = 11

DEFAULT_WINDOW = 65_535
DEFAULT_FRAME = 16_384
MAX_WINDOW = (1 << 31) - 1
# what a peer may send ahead: a stream's window is given back as its data is consumed, the connection's
# as frames arrive
STREAM_WINDOW = 4 << 20
CONNECTION_WINDOW = 1 << 30
MAX_HEADER_LIST = 64 << 10  # decoded header fields of one block, as grpc's own hard limit

_FRAME = struct.Struct(">IBI")  # 24-bit length and 8-bit type, flags, stream id
_SETTING = struct.Struct(">HI")
_U32 = struct.Struct(">I")

# HPACK's static table (RFC 7541, appendix A): the index of each name, for literal fields by name index
_STATIC_NAMES: dict[bytes, int] = {}
for _index, (_name, _) in enumerate(hpack.table.HeaderTable.STATIC_TABLE, start=1):
    _STATIC_NAMES.setdefault(_name, _index)


class ProtocolError(Exception):
    """The peer broke the protocol: the connection ends with ``GOAWAY`` and ``code``."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def encode_headers(headers: list[tuple[bytes, bytes]]) -> bytes:
    """A header block of literal fields without indexing: no dynamic table, on either side."""
    block = bytearray()
    for name, value in headers:
        index = _STATIC_NAMES.get(name)
        # a name by its static index (4-bit prefix), else a literal name; values are literal strings
        block += encode_integer(index, 4) if index else b"\x00" + encode_integer(len(name), 7) + name
        block += encode_integer(len(value), 7) + value
    return bytes(block)


def frame(kind: int, flags: int, stream_id: int, payload: bytes | memoryview = b"") -> bytes:
    return _FRAME.pack(len(payload) << 8 | kind, flags, stream_id) + payload


def settings_frame(settings: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(_SETTING.pack(k, v) for k, v in settings.items()))


def goaway(last_stream: int, code: int, message: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, _U32.pack(last_stream) + _U32.pack(code) + message[:256])


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(increment))


@dataclass
class _Sending:
    """One stream's send side: its window, and what waits for window (data, then its trailers)."""

    window: int
    waiting: deque = field(default_factory=deque)  # (data: bytes, end_stream) or (None, block, end)
    queued: int = 0  # bytes of the data in ``waiting``


class Endpoint(asyncio.Protocol):
    """One HTTP/2 connection (``client_side``: to Triton); ``calls`` holds each stream's call."""

    client_side = False

    def __init__(self, settings: dict[int, int]) -> None:
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()
        self.our_settings = settings
        self.buffer = bytearray()
        self.preface_seen = self.client_side  # a client's connection starts with the preface
        self.decoder = hpack.Decoder(max_header_list_size=MAX_HEADER_LIST)
        self.block: tuple[int, int, bytearray] | None = None  # a header block awaiting CONTINUATION
        self.peer_window = DEFAULT_WINDOW  # what the peer lets each new stream send
        self.peer_frame = DEFAULT_FRAME
        self.peer_streams = MAX_WINDOW  # the peer's SETTINGS_MAX_CONCURRENT_STREAMS
        self.send_window = DEFAULT_WINDOW  # the connection's
        self.sending: dict[int, _Sending] = {}
        self.queued = 0  # bytes of DATA waiting for the peer's window, all streams
        self.calls: dict[int, Any] = {}  # stream id -> the subclass's call on it
        self.received = 0  # connection-level bytes not yet given back
        self.stream_received: dict[int, int] = {}
        self.max_frame_in = settings.get(MAX_FRAME_SIZE, DEFAULT_FRAME)
        self.out: list[bytes] = []
        self.flush_pending = False
        self.closed = False

    # -- the transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  (uvloop's is no asyncio.Transport)
        opening = [PREFACE] if self.client_side else []
        opening += [settings_frame(self.our_settings), window_update(0, CONNECTION_WINDOW - DEFAULT_WINDOW)]
        transport.write(b"".join(opening))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.on_closed(exc)

    def write(self, data: bytes) -> None:
        """Queue ``data``; everything queued in one turn of the loop goes out in one write."""
        if self.closed:
            return
        self.out.append(data)
        if not self.flush_pending:
            self.flush_pending = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self.flush_pending = False
        if self.out and not self.closed and self.transport is not None:
            data, self.out = b"".join(self.out), []
            self.transport.write(data)

    def close(self, code: int = NO_ERROR, message: str = "", last_stream: int = 0) -> None:
        """``GOAWAY`` with ``code`` and end the connection."""
        if self.closed or self.transport is None:
            return
        self.write(goaway(last_stream, code, message.encode()))
        self._flush()
        self.closed = True
        self.transport.close()

    # -- receiving

    def data_received(self, data: bytes) -> None:
        if self.closed:  # a connection ended by this side only waits for the socket to close
            return
        buffer = self.buffer
        buffer += data
        if not self.preface_seen:
            if not PREFACE.startswith(bytes(buffer[: len(PREFACE)])):
                self.close(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                return
            if len(buffer) < len(PREFACE):
                return  # the rest of the preface is still on its way
            del buffer[: len(PREFACE)]
            self.preface_seen = True
        position, size = 0, len(buffer)
        try:
            with memoryview(buffer) as view:
                while size - position >= 9:
                    head, flags, stream_id = _FRAME.unpack_from(view, position)
                    length = head >> 8
                    if length > self.max_frame_in:
                        raise ProtocolError(FRAME_SIZE_ERROR, f"a frame of {length} bytes")
                    end = position + 9 + length
                    if end > size:
                        break
                    payload = bytes(view[position + 9 : end])
                    position = end
                    self._frame(head & 0xFF, flags, stream_id & 0x7FFFFFFF, payload)
                    if self.closed:
                        return
        except ProtocolError as error:
            log.debug("HTTP/2 protocol error from the peer: %s", error)
            self.close(error.code, str(error))
            return
        del buffer[:position]

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self.block is not None and kind != CONTINUATION:
            raise ProtocolError(PROTOCOL_ERROR, "a header block was interrupted")
        if kind == DATA:
            self.received += len(payload)  # the connection's window, given back once half of it is used
            if self.received >= CONNECTION_WINDOW // 2:
                self.write(window_update(0, self.received))
                self.received = 0
            if flags & PADDED:
                payload = _unpad(payload)
            self.on_data(stream_id, payload, bool(flags & END_STREAM))
        elif kind == HEADERS:
            if flags & PADDED:
                payload = _unpad(payload)
            if flags & PRIORITY_FLAG:
                payload = payload[5:]
            if flags & END_HEADERS:
                self._headers(stream_id, flags, payload)
            else:
                self.block = (stream_id, flags, bytearray(payload))
        elif kind == CONTINUATION:
            if self.block is None or self.block[0] != stream_id:
                raise ProtocolError(PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
            self.block[2].extend(payload)
            if len(self.block[2]) > MAX_HEADER_LIST:
                raise ProtocolError(PROTOCOL_ERROR, "a header block above 64 KiB")
            if flags & END_HEADERS:
                block_stream, block_flags, block = self.block
                self.block = None
                self._headers(block_stream, block_flags, bytes(block))
        elif kind == SETTINGS:
            if not flags & ACK:
                self._settings(payload)
        elif kind == WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == PING:
            if not flags & ACK:
                self.write(frame(PING, ACK, 0, payload))
        elif kind == RST_STREAM:
            self.forget(stream_id)
            self.on_reset(stream_id, _U32.unpack_from(payload)[0] if len(payload) == 4 else CANCEL)
        elif kind == GOAWAY:
            last, code = struct.unpack_from(">II", payload) if len(payload) >= 8 else (0, PROTOCOL_ERROR)
            self.on_goaway(last & 0x7FFFFFFF, code, payload[8:])
        elif kind == PUSH_PROMISE:
            raise ProtocolError(PROTOCOL_ERROR, "server push is not enabled")
        # PRIORITY and unknown frame types are ignored

    def _headers(self, stream_id: int, flags: int, block: bytes) -> None:
        try:
            headers = _indexed_only(self.decoder, block) or self.decoder.decode(block, raw=True)
        except HPACKError as error:
            raise ProtocolError(COMPRESSION_ERROR, f"header block: {error}") from error
        self.on_headers(stream_id, headers, bool(flags & END_STREAM))

    def _settings(self, payload: bytes) -> None:
        if len(payload) % 6:
            raise ProtocolError(FRAME_SIZE_ERROR, "a SETTINGS frame not made of 6-byte entries")
        for offset in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, offset)
            if key == INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ProtocolError(FLOW_CONTROL_ERROR, "an initial window above 2^31 - 1")
                delta, self.peer_window = value - self.peer_window, value
                for sending in self.sending.values():
                    sending.window += delta
            elif key == MAX_FRAME_SIZE:
                if not DEFAULT_FRAME <= value <= (1 << 24) - 1:
                    raise ProtocolError(PROTOCOL_ERROR, f"a maximum frame size of {value}")
                self.peer_frame = value
            elif key == MAX_CONCURRENT_STREAMS:
                self.peer_streams = value
            # HEADER_TABLE_SIZE and the rest need nothing: our blocks use no dynamic table
        self.write(frame(SETTINGS, ACK, 0))
        self.on_settings()
        for stream_id in list(self.sending):
            self._send_waiting(stream_id)

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ProtocolError(FRAME_SIZE_ERROR, "a WINDOW_UPDATE not of 4 bytes")
        increment = _U32.unpack(payload)[0] & 0x7FFFFFFF
        if stream_id == 0:
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise ProtocolError(FLOW_CONTROL_ERROR, "the connection window above 2^31 - 1")
            for waiting in [s for s, sending in self.sending.items() if sending.waiting]:
                self._send_waiting(waiting)
                if self.send_window <= 0:
                    break
            return
        sending = self.sending.get(stream_id)
        if sending is not None:
            sending.window += increment
            self._send_waiting(stream_id)

    def consumed(self, stream_id: int, size: int) -> None:
        """``size`` bytes of ``stream_id`` were taken off the front's hands: the peer may send more."""
        total = self.stream_received.get(stream_id, 0) + size
        if total >= STREAM_WINDOW // 2:
            self.write(window_update(stream_id, total))
            total = 0
        self.stream_received[stream_id] = total

    # -- sending

    def open_stream(self, stream_id: int) -> None:
        self.sending[stream_id] = _Sending(self.peer_window)

    def send_headers(self, stream_id: int, block: bytes, end_stream: bool = False) -> None:
        """A header block (``encode_headers``) on ``stream_id``, after any data still waiting."""
        sending = self.sending.get(stream_id)
        if sending is not None and sending.waiting:
            sending.waiting.append((None, block, end_stream))
        else:
            self._write_headers(stream_id, block, end_stream)

    def _write_headers(self, stream_id: int, block: bytes, end_stream: bool) -> None:
        flags = END_STREAM if end_stream else 0
        if end_stream:
            self.sending.pop(stream_id, None)
        if len(block) <= self.peer_frame:
            self.write(frame(HEADERS, flags | END_HEADERS, stream_id, block))
            return
        chunks = [block[i : i + self.peer_frame] for i in range(0, len(block), self.peer_frame)]
        frames = [frame(HEADERS, flags, stream_id, chunks[0])]
        frames += [frame(CONTINUATION, 0, stream_id, chunk) for chunk in chunks[1:-1]]
        frames.append(frame(CONTINUATION, END_HEADERS, stream_id, chunks[-1]))
        self.write(b"".join(frames))

    def send_data(self, stream_id: int, data: bytes | memoryview, end_stream: bool = False) -> None:
        """``data`` on ``stream_id`` as the windows allow; the rest waits for ``WINDOW_UPDATE``."""
        sending = self.sending.get(stream_id)
        if sending is None:
            return  # reset meanwhile
        rest = data if sending.waiting else self._write_data(stream_id, sending, data, end_stream)
        if rest is not None:
            sending.waiting.append((rest, end_stream))
            sending.queued += len(rest)
            self.queued += len(rest)

    def _write_data(
        self, stream_id: int, sending: _Sending, data: bytes | memoryview, end_stream: bool
    ) -> memoryview | None:
        """Write what the windows allow of ``data`` (an empty last frame needs none); the rest, or None."""
        view = memoryview(data)
        size = max(0, min(sending.window, self.send_window, len(view)))
        if not size and view:
            return view
        frames, sent = [], 0
        while not frames or sent < size:
            chunk = view[sent : sent + min(self.peer_frame, size - sent)]
            sent += len(chunk)
            last = end_stream and sent == len(view)
            frames.append(frame(DATA, END_STREAM if last else 0, stream_id, chunk))
        sending.window -= sent
        self.send_window -= sent
        self.write(b"".join(frames))
        if sent < len(view):
            return view[sent:]
        if end_stream:
            self.sending.pop(stream_id, None)
        return None

    def _send_waiting(self, stream_id: int) -> None:
        sending = self.sending.get(stream_id)
        while sending is not None and sending.waiting:
            item = sending.waiting[0]
            if item[0] is None:
                sending.waiting.popleft()
                self._write_headers(stream_id, item[1], item[2])
                continue
            rest = self._write_data(stream_id, sending, item[0], item[1])
            written = len(item[0]) - (0 if rest is None else len(rest))
            sending.queued -= written
            self.queued -= written
            if rest is not None:
                sending.waiting[0] = (rest, item[1])
                return
            sending.waiting.popleft()

    def reset(self, stream_id: int, code: int = CANCEL) -> None:
        self.forget(stream_id)
        self.write(frame(RST_STREAM, 0, stream_id, _U32.pack(code)))

    def forget(self, stream_id: int) -> None:
        """``stream_id`` is closed both ways: drop what is kept for it."""
        sending = self.sending.pop(stream_id, None)
        if sending is not None:
            self.queued -= sending.queued
            sending.queued = 0
        self.stream_received.pop(stream_id, None)

    # -- what subclasses handle

    def on_headers(self, stream_id: int, headers: list[tuple[bytes, bytes]], end_stream: bool) -> None:
        raise NotImplementedError

    def on_data(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        call = self.calls.get(stream_id)
        if call is not None:
            call.on_data(data, end_stream)

    def on_reset(self, stream_id: int, code: int) -> None:
        call = self.calls.get(stream_id)
        if call is not None:
            call.on_reset(code)

    def on_goaway(self, last_stream: int, code: int, debug: bytes) -> None:
        self.close()

    def on_settings(self) -> None:
        """The peer's SETTINGS arrived (and were acknowledged)."""

    def on_closed(self, error: Exception | None) -> None:
        raise NotImplementedError


def _indexed_only(decoder: hpack.Decoder, block: bytes) -> list[tuple[bytes, bytes]] | None:
    """A block of one-byte indexed fields (a peer's usual), decoded fast; None for any other."""
    if not block or len(block) > 64 or min(block) < 0x80 or max(block) == 0xFF:
        return None
    entry = decoder.header_table.get_by_index  # the dynamic table holds memoryviews
    return [(bytes(name), bytes(value)) for name, value in (entry(byte & 0x7F) for byte in block)]


def _unpad(payload: bytes) -> bytes:
    if not payload or payload[0] >= len(payload):
        raise ProtocolError(PROTOCOL_ERROR, "padding longer than the frame")
    return payload[1 : len(payload) - payload[0]]
