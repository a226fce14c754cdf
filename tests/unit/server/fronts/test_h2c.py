"""The gRPC front's own HTTP/2 (``server.fronts.h2c``) without a server: header blocks, flow control and
frame bounds over an in-memory transport. The fault matrix runs the front against the real server
(tests/faults/test_grpc_front.py and the rows it names)."""

from __future__ import annotations

import asyncio
import struct

import hpack

from server.fronts import h2c
from tests.unit.server.fronts.h2c_memory import MemoryTransport, Recorder, frames


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


class ServerSide(Recorder):
    """The front's end of a client's connection: it reads the client's preface first."""

    client_side = False


def test_a_client_preface_may_arrive_in_pieces_and_anything_else_ends_the_connection() -> None:
    async def run() -> None:
        endpoint, transport = ServerSide(), MemoryTransport()
        endpoint.connection_made(transport)
        endpoint.data_received(h2c.PREFACE[:10])
        endpoint.data_received(h2c.PREFACE[10:] + h2c.frame(h2c.PING, 0, 0, b"p" * 8))
        await asyncio.sleep(0)
        assert not transport.closed and (h2c.PING, h2c.ACK, 0, b"p" * 8) in frames(transport.data)
        for wrong in (b"GET / HTTP/1.1\r\n", h2c.PREFACE[:-1] + b"x" + h2c.frame(h2c.PING, 0, 0, b"p" * 8)):
            endpoint, transport = ServerSide(), MemoryTransport()
            endpoint.connection_made(transport)
            transport.data.clear()
            endpoint.data_received(wrong)
            await asyncio.sleep(0)
            assert transport.closed
            goaway = [payload for kind, _, _, payload in frames(transport.data) if kind == h2c.GOAWAY]
            assert struct.unpack_from(">I", goaway[0], 4)[0] == h2c.PROTOCOL_ERROR

    asyncio.run(run())
