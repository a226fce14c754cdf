"""The gRPC front's own HTTP/2 (``server.fronts.h2c``, ``server.fronts.grpc_wire``) without a server:
header blocks, flow control, message bounds and the handshake timeout, over in-memory transports. The
fault matrix runs the front against the real server (tests/faults/test_grpc_front.py and the rows it
names)."""

from __future__ import annotations

import asyncio
import gzip
import struct
import zlib

import hpack
import pytest

from server.fronts import h2c
from server.fronts.grpc_wire import (
    RESOURCE_EXHAUSTED,
    ConnectionLimits,
    FrontConnection,
    GrpcError,
    MessageReader,
    ServerCall,
    format_timeout,
    frame_message,
    parse_timeout,
    read_status,
)

PATH = b"/inference.GRPCInferenceService/ModelInfer"


class MemoryTransport:
    """What an ``Endpoint`` writes, kept; ``close`` noted."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.data += data

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> tuple[str, int]:
        return ("127.0.0.1", 40000)


def frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """(type, flags, stream, payload) of each frame in ``data``."""
    found, position = [], 0
    while position < len(data):
        head, flags, stream = struct.unpack_from(">IBI", data, position)
        length = head >> 8
        found.append((head & 0xFF, flags, stream, bytes(data[position + 9 : position + 9 + length])))
        position += 9 + length
    return found


class Recorder(h2c.Endpoint):
    """An endpoint that keeps what it is given."""

    client_side = True

    def __init__(self) -> None:
        super().__init__({})
        self.events: list[tuple] = []

    def on_headers(self, stream_id: int, headers: list, end_stream: bool) -> None:
        self.events.append(("headers", stream_id, headers, end_stream))

    def on_data(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        self.events.append(("data", stream_id, data, end_stream))

    def on_reset(self, stream_id: int, code: int) -> None:
        self.events.append(("reset", stream_id, code))

    def on_closed(self, error: Exception | None) -> None:
        self.events.append(("closed",))


def test_header_blocks_are_literal_fields_any_decoder_reads() -> None:
    headers = [
        (b":status", b"200"),
        (b"user-agent", b"x" * 300),  # a static name of index 58, a value longer than 127 bytes
        (b"triton-grpc-protocol-triton-front-key", b"secret"),  # a name of its own
    ]
    decoder = hpack.Decoder()
    assert decoder.decode(h2c.encode_headers(headers), raw=True) == headers
    assert decoder.header_table.dynamic_entries == type(decoder.header_table.dynamic_entries)()


def test_indexed_blocks_are_read_as_hpack_reads_them() -> None:
    encoder, decoder = hpack.Encoder(), hpack.Decoder()
    headers = [(b":status", b"200"), (b"content-type", b"application/grpc"), (b"grpc-status", b"0")]
    first = encoder.encode(headers)
    assert h2c._indexed_only(decoder, first) is None  # literals that fill the dynamic table
    assert decoder.decode(first, raw=True) == headers
    second = encoder.encode(headers)
    assert h2c._indexed_only(decoder, second) == headers == hpack.Decoder().decode(first, raw=True)


def test_data_beyond_the_windows_waits_and_the_trailers_wait_behind_it() -> None:
    async def run() -> None:
        endpoint, transport = Recorder(), MemoryTransport()
        endpoint.connection_made(transport)
        transport.data.clear()
        endpoint.open_stream(1)
        endpoint.send_data(1, b"a" * 100_000)
        endpoint.send_headers(1, h2c.encode_headers([(b"grpc-status", b"0")]), end_stream=True)
        await asyncio.sleep(0)
        sent = frames(transport.data)
        assert all(kind == h2c.DATA and len(payload) <= h2c.DEFAULT_FRAME for kind, _, _, payload in sent)
        assert sum(len(payload) for *_, payload in sent) == h2c.DEFAULT_WINDOW
        transport.data.clear()
        endpoint.data_received(h2c.window_update(0, 50_000) + h2c.window_update(1, 50_000))
        await asyncio.sleep(0)
        sent = frames(transport.data)
        assert sum(len(p) for kind, _, _, p in sent if kind == h2c.DATA) == 100_000 - h2c.DEFAULT_WINDOW
        assert sent[-1][0] == h2c.HEADERS and sent[-1][1] & h2c.END_STREAM
        assert 1 not in endpoint.sending

    asyncio.run(run())


def test_a_frame_above_the_size_announced_ends_the_connection() -> None:
    async def run() -> None:
        endpoint, transport = Recorder(), MemoryTransport()
        endpoint.connection_made(transport)
        transport.data.clear()  # the preface, SETTINGS and WINDOW_UPDATE
        endpoint.data_received(h2c.frame(h2c.DATA, 0, 1, b"x" * (h2c.DEFAULT_FRAME + 1)))
        await asyncio.sleep(0)
        assert transport.closed
        goaway = [payload for kind, _, _, payload in frames(transport.data) if kind == h2c.GOAWAY]
        assert struct.unpack_from(">I", goaway[0], 4)[0] == h2c.FRAME_SIZE_ERROR

    asyncio.run(run())


def test_messages_are_read_whole_across_frames_and_bounded_by_their_prefix() -> None:
    reader = MessageReader(limit=100)
    wire = frame_message(b"a" * 60) + frame_message(b"b" * 10)
    assert reader.feed(wire[:30]) == []
    assert reader.feed(wire[30:]) == [(b"a" * 60, 65), (b"b" * 10, 15)]
    with pytest.raises(GrpcError) as refused:  # the prefix alone: nothing of the message is buffered
        MessageReader(limit=100).feed(b"\x00" + (101).to_bytes(4, "big"))
    assert refused.value.code == RESOURCE_EXHAUSTED and "101 vs. 100" in refused.value.details


@pytest.mark.parametrize("encoding", [b"gzip", b"deflate"])
def test_compressed_messages_are_unpacked_within_the_bound(encoding: bytes) -> None:
    pack = gzip.compress if encoding == b"gzip" else zlib.compress
    message = pack(b"c" * 80)
    wire = b"\x01" + len(message).to_bytes(4, "big") + message
    assert MessageReader(100, encoding).feed(wire) == [(b"c" * 80, len(wire))]
    bomb = pack(b"\x00" * 10_000)  # small on the wire, far above the bound unpacked
    with pytest.raises(GrpcError) as refused:
        MessageReader(100, encoding).feed(b"\x01" + len(bomb).to_bytes(4, "big") + bomb)
    assert refused.value.code == RESOURCE_EXHAUSTED


def test_timeouts_and_statuses_read_as_grpc_writes_them() -> None:
    assert parse_timeout(b"10S") == 10.0 and parse_timeout(b"250m") == 0.25 and parse_timeout(b"2M") == 120.0
    assert (
        parse_timeout(b"123456789S") is None and parse_timeout(b"10x") is None and parse_timeout(b"S") is None
    )
    assert format_timeout(0.0001) == b"1m" and format_timeout(600.0) == b"600000m"
    code, details, trailing = read_status(
        [(b"grpc-status", b"3"), (b"grpc-message", b"bad%20input"), (b"k", b"v")]
    )
    assert (code, details, trailing) == (3, "bad input", [(b"k", b"v")])


def _front(handshake_s: float = 10.0, served: list | None = None) -> tuple[FrontConnection, MemoryTransport]:
    async def serve(call: ServerCall) -> None:
        (served if served is not None else []).append(call)
        call.reply(call.message())

    limits = ConnectionLimits(max_message_bytes=1000, handshake_s=handshake_s, idle_s=300.0)
    connection = FrontConnection(
        limits, {"ModelInfer": False}, "/inference.GRPCInferenceService/", serve, set()
    )
    transport = MemoryTransport()
    connection.connection_made(transport)
    return connection, transport


def test_a_connection_without_its_handshake_is_closed() -> None:
    async def run() -> None:
        silent, silent_transport = _front(handshake_s=0.05)
        silent.data_received(h2c.PREFACE)  # the preface, no SETTINGS
        done, done_transport = _front(handshake_s=0.05)
        done.data_received(h2c.PREFACE + h2c.settings_frame({}))
        await asyncio.sleep(0.2)
        assert silent_transport.closed and not done_transport.closed

    asyncio.run(run())


def _call(stream_id: int, message: bytes) -> bytes:
    headers = [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", PATH),
        (b"content-type", b"application/grpc"),
    ]
    return h2c.frame(h2c.HEADERS, h2c.END_HEADERS, stream_id, h2c.encode_headers(headers)) + h2c.frame(
        h2c.DATA, h2c.END_STREAM, stream_id, message
    )


def test_a_call_is_answered_and_one_above_the_bound_refused_from_its_prefix() -> None:
    async def run() -> None:
        served: list[ServerCall] = []
        connection, transport = _front(served=served)
        connection.data_received(h2c.PREFACE + h2c.settings_frame({}))
        connection.data_received(_call(1, frame_message(b"hello")))
        connection.data_received(_call(3, b"\x00" + (5000).to_bytes(4, "big") + b"x" * 100))
        await asyncio.sleep(0.01)
        assert [call.stream_id for call in served] == [1]  # the large one never reached the handler
        decoder, answers = hpack.Decoder(), {}
        for kind, _, stream, payload in frames(transport.data):
            if kind == h2c.HEADERS:
                answers.setdefault(stream, []).append(dict(decoder.decode(payload, raw=True)))
            elif kind == h2c.DATA:
                answers.setdefault(stream, []).append(payload)
        assert answers[1] == [
            {b":status": b"200", b"content-type": b"application/grpc"},
            frame_message(b"hello"),
            {b"grpc-status": b"0"},
        ]
        assert answers[3][0][b"grpc-status"] == str(RESOURCE_EXHAUSTED).encode()
        assert b"5000 vs. 1000" in answers[3][0][b"grpc-message"]
        assert not connection.calls

    asyncio.run(run())


def test_a_stream_gets_window_for_a_message_larger_than_one_but_not_for_a_backlog() -> None:
    """A stream's window is given back as its bytes arrive while the messages waiting for the handler
    stay under one window (else a message above the window could never arrive whole), and withheld
    beyond that until the handler takes them."""

    async def run() -> None:
        taken: list[bytes] = []
        go = asyncio.Event()

        async def serve(call: ServerCall) -> None:
            await go.wait()
            while (message := await call.receive()) is not None:
                taken.append(message)

        limits = ConnectionLimits(max_message_bytes=64 << 20, handshake_s=10.0, idle_s=300.0)
        methods = {"ModelStreamInfer": True}
        connection = FrontConnection(limits, methods, "/inference.GRPCInferenceService/", serve, set())
        transport = MemoryTransport()
        connection.connection_made(transport)
        headers = [(b":method", b"POST"), (b":path", b"/inference.GRPCInferenceService/ModelStreamInfer")]
        connection.data_received(
            h2c.PREFACE
            + h2c.settings_frame({})
            + h2c.frame(h2c.HEADERS, h2c.END_HEADERS, 1, h2c.encode_headers(headers))
        )

        async def send(data: bytes) -> int:
            """Feed ``data`` as DATA frames; the window the front gave back for stream 1 meanwhile."""
            transport.data.clear()
            for start in range(0, len(data), h2c.DEFAULT_FRAME):
                connection.data_received(h2c.frame(h2c.DATA, 0, 1, data[start : start + h2c.DEFAULT_FRAME]))
            await asyncio.sleep(0)  # the front writes once per turn of the loop
            updates = [
                p
                for kind, _, stream, p in frames(transport.data)
                if kind == h2c.WINDOW_UPDATE and stream == 1
            ]
            return sum(struct.unpack(">I", p)[0] for p in updates)

        large = frame_message(b"x" * (6 << 20))  # above the 4 MiB window: must get window as it comes
        assert await send(large) >= len(large) - h2c.STREAM_WINDOW
        backlog = frame_message(b"y" * (1 << 20)) * 6  # whole messages the handler has not taken
        assert await send(backlog) == 0
        go.set()
        await asyncio.sleep(0.05)
        assert len(taken) == 7
        await asyncio.sleep(0)

    asyncio.run(run())
