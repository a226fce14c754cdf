"""The gRPC front's calls (``server.fronts.grpc_wire``) without a server: message bounds, compression,
timeouts and statuses, the handshake timeout and a stream's window, over in-memory transports. The fault
matrix runs the front against the real server (tests/faults/test_grpc_front.py and the rows it names)."""

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
from tests.unit.server.fronts.h2c_memory import MemoryTransport, frames

PATH = b"/inference.GRPCInferenceService/ModelInfer"


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
