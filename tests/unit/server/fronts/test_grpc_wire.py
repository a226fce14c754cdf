"""The gRPC front's calls (``server.fronts.grpc_wire``) without a server: message bounds, compression,
timeouts and statuses, the handshake timeout and a stream's window, over in-memory transports. The fault
matrix runs the front against the real server (tests/faults/test_grpc_front.py and the rows it names)."""

from __future__ import annotations

import asyncio
import gzip
import struct
import zlib
from urllib.parse import unquote

import hpack
import pytest

from server.fronts import h2c
from server.fronts.client_connections import AddressCounts
from server.fronts.grpc_wire import (
    DEADLINE_EXCEEDED,
    INVALID_ARGUMENT,
    MAX_STREAMS,
    RESOURCE_EXHAUSTED,
    ConnectionLimits,
    FrontConnection,
    GrpcError,
    IncomingBytes,
    MessageReader,
    ServerCall,
    format_timeout,
    frame_message,
    metadata_fault,
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

    limits = ConnectionLimits(
        max_message_bytes=1000, handshake_s=handshake_s, idle_s=300.0, incoming=IncomingBytes(4000)
    )
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

        limits = ConnectionLimits(64 << 20, 10.0, 300.0, IncomingBytes(256 << 20))
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


def _answers(transport: MemoryTransport) -> dict[int, dict[bytes, bytes]]:
    """Each stream's trailers (or trailers-only answer), decoded."""
    decoder, answers = hpack.Decoder(), {}
    for kind, _, stream, payload in frames(transport.data):
        if kind == h2c.HEADERS:
            answers.setdefault(stream, {}).update(dict(decoder.decode(payload, raw=True)))
    return answers


def test_a_call_whose_messages_are_malformed_is_the_clients_fault() -> None:
    """Two messages on a unary call, none, a length prefix that says more than follows, a gzip message
    that does not unpack: ``INVALID_ARGUMENT`` naming what is wrong, never ``INTERNAL`` (fault matrix
    row 69), and never served."""

    async def run() -> None:
        served: list[ServerCall] = []
        connection, transport = _front(served=served)
        connection.data_received(h2c.PREFACE + h2c.settings_frame({}))
        connection.data_received(_call(1, frame_message(b"one") + frame_message(b"two")))
        connection.data_received(_call(3, b""))
        connection.data_received(_call(5, frame_message(b"whole")[:-2]))
        await asyncio.sleep(0.01)
        answers = _answers(transport)
        assert {stream: answers[stream][b"grpc-status"] for stream in (1, 3, 5)} == dict.fromkeys(
            (1, 3, 5), b"3"
        )
        assert b"one message, this one 2" in answers[1][b"grpc-message"]
        assert b"inside a message" in answers[5][b"grpc-message"]
        with pytest.raises(GrpcError) as refused:
            MessageReader(100, b"gzip").feed(b"\x01" + (4).to_bytes(4, "big") + b"nope")
        assert refused.value.code == INVALID_ARGUMENT and "does not decompress" in refused.value.details

    asyncio.run(run())


@pytest.mark.parametrize(
    ("name", "value", "fault"),
    [
        (b"X-Upper", b"v", "is not gRPC's"),
        (b"x y", b"v", "is not gRPC's"),
        (b"", b"v", "is not gRPC's"),
        (b"x-ctl", b"a\x00b", "outside printable ASCII"),
        (b"x-high", b"\xff", "outside printable ASCII"),
        (b"x-bin", b"!!!!", "not base64"),
        (b"x-bin", b"AAAAA", "not base64"),
        (b"x-big", b"a" * 12_000, "above the 4096"),
    ],
)
def test_metadata_triton_would_not_take_is_refused_before_it(name: bytes, value: bytes, fault: str) -> None:
    """Metadata outside gRPC's grammar, or more than Triton always takes: ``INVALID_ARGUMENT`` naming it
    (row 69; Triton reset such a call, ``INTERNAL``, or refused it at random); the call is not served."""

    async def run() -> None:
        served: list[ServerCall] = []
        connection, transport = _front(served=served)
        connection.data_received(h2c.PREFACE + h2c.settings_frame({}))
        headers = [(b":method", b"POST"), (b":path", PATH), (name, value)]
        block = h2c.encode_headers(headers)
        connection.data_received(
            h2c.frame(h2c.HEADERS, h2c.END_HEADERS, 1, block)
            + h2c.frame(h2c.DATA, h2c.END_STREAM, 1, frame_message(b"x"))
        )
        await asyncio.sleep(0.01)
        answer = _answers(transport)[1]
        assert answer[b"grpc-status"] == b"3" and fault in unquote(answer[b"grpc-message"].decode())
        assert served == [] and not connection.calls

    asyncio.run(run())


def test_metadata_grpc_sends_passes() -> None:
    assert (
        metadata_fault([(b":path", b"/x"), (b"x-bin", b"AAE"), (b"x-bin", b"AAEC"), (b"grpc-foo", b"a b~")])
        is None
    )
    assert metadata_fault([(b"user-agent", b"grpc-python/1.66"), (b"x.y_z-1", b"")]) is None


def test_a_client_that_stops_reading_is_not_read_until_it_catches_up() -> None:
    """Answers queue for a client that does not read them: over TCP the front stops reading it (the
    transport's high-water mark), and answers waiting for its HTTP/2 window above one message's bound
    refuse its new calls with ``RESOURCE_EXHAUSTED`` (row 70); the calls begun are answered once it
    reads."""

    async def run() -> None:
        served: list[ServerCall] = []

        async def serve(call: ServerCall) -> None:
            served.append(call)
            call.reply(b"a" * 600)  # above the window the client gives: the rest waits

        limits = ConnectionLimits(1000, 10.0, 300.0, IncomingBytes(4000))
        connection = FrontConnection(
            limits, {"ModelInfer": False}, "/inference.GRPCInferenceService/", serve, set()
        )
        transport = MemoryTransport()
        connection.connection_made(transport)
        connection.pause_writing()
        assert not transport.reading
        connection.resume_writing()
        assert transport.reading
        # the client lets 100 bytes of each stream come, and never more
        connection.data_received(h2c.PREFACE + h2c.settings_frame({h2c.INITIAL_WINDOW_SIZE: 100}))
        for stream in (1, 3, 5):
            connection.data_received(_call(stream, frame_message(b"x")))
            await asyncio.sleep(0.01)
        assert [call.stream_id for call in served] == [1, 3]  # 2 × 505 bytes waiting: above 1000
        answers = _answers(transport)
        assert answers[5][b"grpc-status"] == str(RESOURCE_EXHAUSTED).encode()
        assert b"wait for the client's HTTP/2 window" in answers[5][b"grpc-message"]
        for stream in (1, 3):
            connection.data_received(h2c.window_update(stream, 1000))
        connection.data_received(h2c.window_update(0, 1000))
        await asyncio.sleep(0)  # the front writes once per turn of the loop
        assert connection.queued == 0
        assert {stream: _answers(transport)[stream][b"grpc-status"] for stream in (1, 3)} == {
            1: b"0",
            3: b"0",
        }

    asyncio.run(run())


def test_calls_whose_messages_never_finish_are_bounded_and_answered() -> None:
    """Unary calls whose message never completes: the front holds at most its ``IncomingBytes`` of
    them, all connections together (the call beyond gets ``RESOURCE_EXHAUSTED``), and each is answered
    ``DEADLINE_EXCEEDED`` once its message is late; what they held is free again (fault matrix row 71;
    before: every such call held up to 64 MiB for its connection's life, never answered)."""

    async def run() -> None:
        served: list[ServerCall] = []
        incoming = IncomingBytes(2500)
        limits = ConnectionLimits(1000, 10.0, 300.0, incoming, message_s=0.2)

        async def serve(call: ServerCall) -> None:
            served.append(call)
            call.reply(call.message())

        connections = []
        for _ in range(2):
            connection = FrontConnection(
                limits, {"ModelInfer": False}, "/inference.GRPCInferenceService/", serve, set()
            )
            connection.connection_made(MemoryTransport())
            connection.data_received(h2c.PREFACE + h2c.settings_frame({}))
            connections.append(connection)
        unfinished = frame_message(b"x" * 990)[:900]  # a message of 995 bytes, 900 of them sent
        block = h2c.encode_headers([(b":method", b"POST"), (b":path", PATH)])
        for stream, connection in ((1, connections[0]), (3, connections[0]), (1, connections[1])):
            connection.data_received(
                h2c.frame(h2c.HEADERS, h2c.END_HEADERS, stream, block)
                + h2c.frame(h2c.DATA, 0, stream, unfinished)
            )
        await asyncio.sleep(0)  # the front writes once per turn of the loop
        assert incoming.held == 1800  # the third would pass 2500: refused at once, its bytes dropped
        third = _answers(connections[1].transport)[1]
        assert third[b"grpc-status"] == str(RESOURCE_EXHAUSTED).encode()
        assert "already holds 1800 bytes" in unquote(third[b"grpc-message"].decode())
        assert 1 not in _answers(connections[0].transport)  # the first two wait for the rest
        await asyncio.sleep(0.4)
        late = _answers(connections[0].transport)
        assert {stream: late[stream][b"grpc-status"] for stream in (1, 3)} == {1: b"4", 3: b"4"}
        assert "not complete within 0.2 s" in unquote(late[1][b"grpc-message"].decode())
        assert incoming.held == 0 and served == []
        connections[1].data_received(_call(5, frame_message(b"whole")))  # a whole call is served
        await asyncio.sleep(0.01)
        assert [call.stream_id for call in served] == [5] and incoming.held == 0

    asyncio.run(run())


def test_a_stream_message_begun_must_be_whole_in_time_but_a_stream_may_wait_between_messages() -> None:
    """Fault matrix row 75: on a stream, a message whose first bytes came must be whole within the
    front's message time; else the stream ends ``DEADLINE_EXCEEDED``, its handler (which holds its slot
    and its Triton stream) is cancelled and its bytes are no longer counted (before: never ended, the
    bytes held for the stream's life). A stream may wait as long as it likes between messages, and a
    message the front withholds window from is not the client's delay."""

    async def run() -> None:
        taken: dict[int, list[bytes]] = {}
        cancelled: list[int] = []
        calls: dict[int, ServerCall] = {}
        go = asyncio.Event()

        async def serve(call: ServerCall) -> None:
            calls[call.stream_id] = call
            try:
                if call.stream_id == 5:  # takes nothing yet: the front withholds its window
                    await go.wait()
                while (message := await call.receive()) is not None:
                    taken.setdefault(call.stream_id, []).append(message)
                    call.send_message(b"taken")
            except asyncio.CancelledError:
                cancelled.append(call.stream_id)
                raise

        incoming = IncomingBytes(256 << 20)
        limits = ConnectionLimits(64 << 20, 10.0, 300.0, incoming, message_s=0.2)
        connection = FrontConnection(
            limits, {"ModelStreamInfer": True}, "/inference.GRPCInferenceService/", serve, set()
        )
        connection.connection_made(MemoryTransport())
        headers = [(b":method", b"POST"), (b":path", b"/inference.GRPCInferenceService/ModelStreamInfer")]
        connection.data_received(h2c.PREFACE + h2c.settings_frame({}))

        def send(stream: int, data: bytes, end: bool = False) -> None:
            for start in range(0, len(data), h2c.DEFAULT_FRAME):
                connection.data_received(
                    h2c.frame(h2c.DATA, 0, stream, data[start : start + h2c.DEFAULT_FRAME])
                )
            if end:
                connection.data_received(h2c.frame(h2c.DATA, h2c.END_STREAM, stream))

        begun = frame_message(b"z" * 100)
        backlog = frame_message(b"y" * (5 << 20))  # above the stream window: the rest is withheld
        for stream, data in (
            (1, frame_message(b"first") + begun[:50]),
            (3, frame_message(b"first")),
            (5, backlog + begun[:50]),
        ):
            connection.data_received(
                h2c.frame(h2c.HEADERS, h2c.END_HEADERS, stream, h2c.encode_headers(headers))
            )
            send(stream, data)
        await asyncio.sleep(0.5)
        answers = _answers(connection.transport)
        assert answers[1][b"grpc-status"] == str(DEADLINE_EXCEEDED).encode()
        assert "not complete within 0.2 s of its first byte" in unquote(answers[1][b"grpc-message"].decode())
        assert cancelled == [1] and taken[1] == [b"first"]
        assert not calls[1].reader.pending  # dropped as the stream ended, not when the collector runs
        assert b"grpc-status" not in answers[3] and 5 not in answers
        assert incoming.held == len(backlog) + 50  # stream 5's alone
        send(3, frame_message(b"later"), end=True)  # stream 3 goes on after its wait
        go.set()
        await asyncio.sleep(0.01)
        send(5, begun[50:], end=True)  # the rest of stream 5's message, once it has window again
        await asyncio.sleep(0.01)
        answers = _answers(connection.transport)
        assert {stream: answers[stream][b"grpc-status"] for stream in (3, 5)} == {3: b"0", 5: b"0"}
        assert taken[3] == [b"first", b"later"] and len(taken[5]) == 2 and incoming.held == 0

    asyncio.run(run())


def test_a_new_call_on_a_stream_id_already_used_ends_the_connection() -> None:
    """A client's HEADERS opening a call on an id at or below one it used is a protocol error (RFC 9113,
    5.1.1): ``GOAWAY``, which the client reads as its calls' end (before: ignored, the call never
    answered). Trailers on a call the front ended are still taken quietly."""

    async def run() -> None:
        connection, transport = _front()
        connection.data_received(h2c.PREFACE + h2c.settings_frame({}))
        connection.data_received(_call(5, frame_message(b"first")))
        await asyncio.sleep(0.01)
        trailers = h2c.encode_headers([(b"x-trailer", b"1")])
        connection.data_received(h2c.frame(h2c.HEADERS, h2c.END_HEADERS | h2c.END_STREAM, 5, trailers))
        assert not transport.closed
        connection.data_received(_call(3, frame_message(b"second")))
        assert transport.closed
        [goaway] = [payload for kind, _, _, payload in frames(transport.data) if kind == h2c.GOAWAY]
        assert struct.unpack(">II", goaway[:8]) == (0, h2c.PROTOCOL_ERROR) and b"id 3 after 5" in goaway

    asyncio.run(run())


def test_streams_beyond_the_advertised_limit_are_refused_and_a_silent_stream_ends() -> None:
    """Fault matrix row 77: the front advertises ``SETTINGS_MAX_CONCURRENT_STREAMS`` and resets a
    stream beyond it ``REFUSED_STREAM`` (RFC 9113, 5.1.2); a stream that sent its headers and no message
    ends ``DEADLINE_EXCEEDED`` after the connection's idle time, its place free again, and the
    connection then idles out (before: no limit, no timer, and such a stream kept its connection open
    for good)."""

    async def run() -> None:
        served: list[ServerCall] = []

        async def serve(call: ServerCall) -> None:
            served.append(call)

        limits = ConnectionLimits(1000, 10.0, 0.2, IncomingBytes(4000))
        methods = {"ModelStreamInfer": True}
        connection = FrontConnection(limits, methods, "/inference.GRPCInferenceService/", serve, set())
        transport = MemoryTransport()
        connection.connection_made(transport)
        [settings] = [p for kind, _, _, p in frames(transport.data) if kind == h2c.SETTINGS]
        advertised = dict(struct.unpack(">HI", settings[i : i + 6]) for i in range(0, len(settings), 6))
        assert advertised[h2c.MAX_CONCURRENT_STREAMS] == MAX_STREAMS
        headers = [(b":method", b"POST"), (b":path", b"/inference.GRPCInferenceService/ModelStreamInfer")]
        block = h2c.encode_headers(headers)
        connection.data_received(h2c.PREFACE + h2c.settings_frame({}))
        streams = range(1, 2 * (MAX_STREAMS + 2), 2)
        connection.data_received(b"".join(h2c.frame(h2c.HEADERS, h2c.END_HEADERS, s, block) for s in streams))
        await asyncio.sleep(0)
        resets = {
            stream: struct.unpack(">I", payload)[0]
            for kind, _, stream, payload in frames(transport.data)
            if kind == h2c.RST_STREAM
        }
        assert resets == dict.fromkeys(streams[MAX_STREAMS:], h2c.REFUSED_STREAM)
        assert len(connection.calls) == MAX_STREAMS and not transport.closed
        await asyncio.sleep(0.3)
        answers = _answers(transport)
        assert {answers[stream][b"grpc-status"] for stream in streams[:MAX_STREAMS]} == {b"4"}
        assert "sent no message within 0.2 s" in unquote(answers[1][b"grpc-message"].decode())
        assert not connection.calls and served == []
        await asyncio.sleep(1.2)  # the idle check runs at most once a second
        assert transport.closed

    asyncio.run(run())


class _AddressTransport(MemoryTransport):
    """A transport whose client is at ``address``."""

    def __init__(self, address: str) -> None:
        super().__init__()
        self.address = address

    def get_extra_info(self, name: str) -> tuple[str, int]:
        return (self.address, 40000)


def test_streams_are_bounded_per_client_address_and_in_all_over_connections() -> None:
    """Fault matrix row 77: the front counts the calls open on all its connections; one beyond its
    address's share or beyond the total is reset ``REFUSED_STREAM``, however few its own connection has
    open (before: only each connection's 1,024 bounded them, 8.4 M streams over 8,192 connections). A
    call that ends, or a connection that closes, frees its places."""

    async def run() -> None:
        async def serve(call: ServerCall) -> None:
            await asyncio.Event().wait()

        streams = AddressCounts(per_address=3, total=5)
        limits = ConnectionLimits(1000, 10.0, 300.0, IncomingBytes(4000), streams=streams)
        block = h2c.encode_headers(
            [(b":method", b"POST"), (b":path", b"/inference.GRPCInferenceService/ModelStreamInfer")]
        )
        connections = {}
        for name, address in (("a", "127.0.0.1"), ("b", "127.0.0.1"), ("c", "10.0.0.2")):
            connection = FrontConnection(
                limits, {"ModelStreamInfer": True}, "/inference.GRPCInferenceService/", serve, set()
            )
            connection.connection_made(_AddressTransport(address))
            connection.data_received(h2c.PREFACE + h2c.settings_frame({}))
            connections[name] = connection

        async def open_streams(name: str, *ids: int) -> dict[int, int]:
            """Open streams ``ids`` on connection ``name``: the RST_STREAM codes the front answered."""
            connection = connections[name]
            connection.transport.data.clear()
            connection.data_received(b"".join(h2c.frame(h2c.HEADERS, h2c.END_HEADERS, s, block) for s in ids))
            await asyncio.sleep(0)  # the front writes once per turn of the loop
            return {
                stream: struct.unpack(">I", payload)[0]
                for kind, _, stream, payload in frames(connection.transport.data)
                if kind == h2c.RST_STREAM
            }

        assert await open_streams("a", 1, 3) == {}
        assert await open_streams("b", 1, 3) == {3: h2c.REFUSED_STREAM}  # its address: 3 at most
        assert await open_streams("c", 1, 3, 5) == {5: h2c.REFUSED_STREAM}  # the front's fifth, then none
        assert (streams.count, dict(streams.by_address)) == (5, {"127.0.0.1": 3, "10.0.0.2": 2})
        connections["a"].data_received(h2c.frame(h2c.RST_STREAM, 0, 1, struct.pack(">I", h2c.CANCEL)))
        assert await open_streams("c", 7) == {}  # the place stream 1 of ``a`` held
        assert await open_streams("b", 5) == {5: h2c.REFUSED_STREAM}
        connections["c"].connection_lost(None)
        assert (streams.count, dict(streams.by_address)) == (2, {"127.0.0.1": 2})
        assert await open_streams("b", 7) == {}

    asyncio.run(run())


def test_a_reset_call_keeps_its_place_until_its_handler_ends() -> None:
    """Fault matrix row 78: a call the client resets (``RST_STREAM``) counts against its connection's and
    its address's streams until its handler has ended: a handler the reset cancelled that is still
    ending, and one that had forwarded the call, which the reset does not cancel (Triton runs it
    anyway): a unary call's waits for Triton's answer, a stream's forwards nothing more and waits for
    Triton's last answer. Nothing is sent to the client after its reset (before: the place was free at
    the reset, so a client that reset each call after sending it never had one open, whatever work its
    calls left)."""

    async def run() -> None:
        answered, ending = asyncio.Event(), asyncio.Event()  # Triton's answer; a cancelled handler's end
        cancelled: list[int] = []
        received: list[bytes | None] = []

        async def serve(call: ServerCall) -> None:
            if call.stream_id == 1:  # a unary call forwarded: its handler waits for Triton's answer
                call.forwarded = True
                await answered.wait()
                call.reply(b"answer")
            elif call.stream_id == 3:  # not forwarded: cancelled by the reset, and ending meanwhile
                try:
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    cancelled.append(call.stream_id)
                    await ending.wait()
                    raise
            else:  # a stream forwarded: its handler reads until the client's side ends
                call.forwarded = True
                while (message := await call.receive()) is not None:
                    received.append(message)
                received.append(None)
                await answered.wait()

        streams = AddressCounts(per_address=3, total=8)
        limits = ConnectionLimits(1000, 10.0, 300.0, IncomingBytes(4000), streams=streams)
        methods = {"ModelInfer": False, "ModelStreamInfer": True}
        connection = FrontConnection(limits, methods, "/inference.GRPCInferenceService/", serve, set())
        connection.connection_made(_AddressTransport("10.0.0.3"))
        connection.data_received(h2c.PREFACE + h2c.settings_frame({}))
        stream_path = [(b":method", b"POST"), (b":path", b"/inference.GRPCInferenceService/ModelStreamInfer")]
        connection.data_received(
            _call(1, frame_message(b"a"))
            + _call(3, frame_message(b"b"))
            + h2c.frame(h2c.HEADERS, h2c.END_HEADERS, 5, h2c.encode_headers(stream_path))
            + h2c.frame(h2c.DATA, 0, 5, frame_message(b"first"))
        )
        await asyncio.sleep(0.01)  # every handler has begun
        transport = connection.transport
        transport.data.clear()
        resets = b"".join(h2c.frame(h2c.RST_STREAM, 0, s, struct.pack(">I", h2c.CANCEL)) for s in (1, 3, 5))
        connection.data_received(resets)
        await asyncio.sleep(0.01)
        assert cancelled == [3] and received == [b"first", None]
        assert sorted(connection.calls) == [1, 3, 5]  # what the connection's 1,024 count
        assert dict(streams.by_address) == {"10.0.0.3": 3}
        connection.data_received(_call(7, frame_message(b"c")))  # beyond the address's 3: refused
        await asyncio.sleep(0)
        assert [(s, p) for kind, _, s, p in frames(transport.data) if kind == h2c.RST_STREAM] == [
            (7, struct.pack(">I", h2c.REFUSED_STREAM))
        ]
        ending.set()
        await asyncio.sleep(0.01)
        assert sorted(connection.calls) == [1, 5] and streams.count == 2
        answered.set()
        await asyncio.sleep(0.01)
        assert not connection.calls and streams.count == 0
        assert [kind for kind, _, _, _ in frames(transport.data) if kind != h2c.RST_STREAM] == []

    asyncio.run(run())
