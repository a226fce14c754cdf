"""In-memory stand-ins for the gRPC front's HTTP/2 unit tests: a transport that keeps what is written,
a reader of the frames in it, and an endpoint that records what it is given."""

from __future__ import annotations

import struct

from server.fronts import h2c


class MemoryTransport:
    """What an ``Endpoint`` writes, kept; ``close`` noted."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = False
        self.reading = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

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
