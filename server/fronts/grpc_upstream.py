"""The gRPC front's calls to tritonserver's loopback gRPC port, on HTTP/2 connections of its own
(``h2c``). Calls share a connection until Triton's stream limit, the stream ids or a ``GOAWAY`` end
it; a connection that fails fails its calls with ``UNAVAILABLE`` and the next call connects again, so
a restarted server is used at once (fault matrix row 46).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable

from server.fronts import h2c
from server.fronts.grpc_wire import (
    CANCELLED,
    INTERNAL,
    OK,
    UNAVAILABLE,
    GrpcError,
    Headers,
    MessageReader,
    format_timeout,
    frame_message,
    read_status,
)

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5.0
LAST_STREAM_ID = (1 << 31) - 1 - (1 << 16)  # a connection's stream ids end; a new one opens before
RESET_STATUS = {h2c.CANCEL: CANCELLED, h2c.REFUSED_STREAM: UNAVAILABLE}
ANSWER_LIMIT = 1 << 31  # Triton's answers are its own: bounded by what it sends


def not_reachable(why: object) -> GrpcError:
    return GrpcError(UNAVAILABLE, f"tritonserver is not reachable: {why}")


class UpstreamCall:
    """One call to Triton: ``write`` messages, ``done_writing``, then ``answers()`` (or ``unary``)."""

    def __init__(self, connection: UpstreamConnection, stream_id: int) -> None:
        self.connection, self.stream_id = connection, stream_id
        self.reader = MessageReader(ANSWER_LIMIT)
        self.initial: Headers | None = None
        self.messages: deque[bytes] = deque()
        self.status: GrpcError | None = None  # set when the call ended (code OK: fine)
        self.waiter: asyncio.Future | None = None
        self.answer: asyncio.Future | None = None  # a unary call's (``unary_answer``)

    def write(self, message: bytes, end: bool = False) -> None:
        """A message to Triton (``end``: the front's last; h2c sends nothing on a stream ended)."""
        if self.status is None:
            self.connection.send_data(self.stream_id, frame_message(message), end)

    def done_writing(self) -> None:
        if self.status is None:
            self.connection.send_data(self.stream_id, b"", end_stream=True)

    def cancel(self) -> None:
        if self.status is None:
            self.status = GrpcError(CANCELLED, "cancelled by the front")
            self.connection.reset(self.stream_id, h2c.CANCEL)
            self.connection.call_ended(self)

    # -- from the connection

    def on_headers(self, headers: Headers, end_stream: bool) -> None:
        if self.initial is None and not end_stream:
            self.initial = [
                (n, v) for n, v in headers if not n.startswith((b":", b"grpc-")) and n != b"content-type"
            ]
            return
        code, details, trailing = read_status(headers)
        self._end(GrpcError(code, details, trailing))

    def on_data(self, data: bytes, end_stream: bool) -> None:
        self.connection.consumed(self.stream_id, len(data))
        try:
            self.messages.extend(message for message, _ in self.reader.feed(data))
        except GrpcError as error:
            self._end(error)
            self.connection.reset(self.stream_id, h2c.CANCEL)
            return
        if end_stream:
            self._end(GrpcError(INTERNAL, "tritonserver ended the call without a status"))
        self._wake()

    def on_reset(self, code: int) -> None:
        self._end(
            GrpcError(RESET_STATUS.get(code, INTERNAL), f"tritonserver reset the call (HTTP/2 error {code})")
        )

    def _end(self, status: GrpcError) -> None:
        if self.status is None:
            self.status = status
            self.connection.call_ended(self)
        self._wake()
        if self.answer is not None and not self.answer.done():
            self._settle(self.answer, status)

    def _settle(self, answer: asyncio.Future, status: GrpcError) -> None:
        if status.code != OK:
            answer.set_exception(status)
        elif len(self.messages) != 1:
            answer.set_exception(
                GrpcError(INTERNAL, f"tritonserver answered a unary call with {len(self.messages)} messages")
            )
        else:
            answer.set_result((self.messages[0], self.initial or [], status.trailing))

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    # -- for the front

    async def _wait(self) -> None:
        self.waiter = self.connection.loop.create_future()
        try:
            await self.waiter
        except asyncio.CancelledError:
            self.cancel()
            raise
        finally:
            self.waiter = None

    async def answers(self) -> AsyncIterator[bytes]:
        """Triton's messages as they come; ``GrpcError`` for a status other than OK at the end."""
        while True:
            while self.messages:
                yield self.messages.popleft()
            if self.status is not None:
                if self.status.code != OK:
                    raise self.status
                return
            await self._wait()

    def unary_answer(self) -> asyncio.Future:
        """The one answer of a unary call as a future; cancelling it cancels the call."""
        answer = self.answer = self.connection.loop.create_future()
        answer.add_done_callback(lambda done: self.cancel() if done.cancelled() else None)
        if self.status is not None:
            self._settle(answer, self.status)
        return answer


class UpstreamConnection(h2c.Endpoint):
    client_side = True

    def __init__(self, upstream: Upstream) -> None:
        super().__init__({h2c.ENABLE_PUSH: 0, h2c.INITIAL_WINDOW_SIZE: h2c.STREAM_WINDOW})
        self.upstream = upstream
        self.next_stream = 1
        self.going_away = False

    def usable(self) -> bool:
        return (
            not self.closed
            and not self.going_away
            and self.next_stream < LAST_STREAM_ID
            and len(self.calls) < self.peer_streams
        )

    def start(self, block: bytes, message: bytes | None = None) -> UpstreamCall:
        """A call with the request headers ``block``; ``message``: a unary call's one, sent with its end."""
        stream_id, self.next_stream = self.next_stream, self.next_stream + 2
        call = self.calls[stream_id] = UpstreamCall(self, stream_id)
        self.open_stream(stream_id)
        self.send_headers(stream_id, block)
        if message is not None:
            call.write(message, end=True)
        return call

    def call_ended(self, call: UpstreamCall) -> None:
        self.calls.pop(call.stream_id, None)
        self.stream_received.pop(call.stream_id, None)
        if call.stream_id in self.sending:  # Triton answered before the front sent all: not needed
            self.reset(call.stream_id, h2c.CANCEL)

    def on_headers(self, stream_id: int, headers: Headers, end_stream: bool) -> None:
        call = self.calls.get(stream_id)
        if call is not None:
            call.on_headers(headers, end_stream)

    def on_goaway(self, last_stream: int, code: int, debug: bytes) -> None:
        """Triton stops taking calls on this connection: those it did not take fail, the rest finish."""
        self.going_away = True
        for stream_id, call in list(self.calls.items()):
            if stream_id > last_stream:
                call._end(not_reachable(f"it is going away (GOAWAY {code})"))
        if not self.calls:
            self.close()

    def on_closed(self, error: Exception | None) -> None:
        if self in self.upstream.connections:
            self.upstream.connections.remove(self)
        for call in list(self.calls.values()):
            call._end(not_reachable(error or "it closed the connection"))


class Upstream:
    """Calls to tritonserver's gRPC port at ``address`` (``host:port``)."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.host, self.port, self.authority = host.strip("[]"), int(port), address.encode()
        self.connections: list[UpstreamConnection] = []
        self.connecting: asyncio.Future | None = None
        self.heads: dict[bytes, bytes] = {}

    def _usable(self) -> UpstreamConnection | None:
        return next((connection for connection in self.connections if connection.usable()), None)

    async def connection(self) -> UpstreamConnection:
        connection = self._usable()
        if connection is not None:
            return connection
        if self.connecting is None:
            self.connecting = asyncio.ensure_future(self._connect())
        return await asyncio.shield(self.connecting)

    async def _connect(self) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                _, connection = await loop.create_connection(
                    lambda: UpstreamConnection(self), self.host, self.port
                )
        except (OSError, TimeoutError) as error:
            raise not_reachable(error or "no connection within 5 s") from None
        finally:
            self.connecting = None
        self.connections.append(connection)
        return connection

    def _block(self, path: bytes, metadata: bytes, timeout_s: float) -> bytes:
        """A call's request headers: their fixed part (encoded once per path), the metadata, the timeout."""
        head = self.heads.get(path)
        if head is None:
            head = self.heads[path] = h2c.encode_headers([
                (b":method", b"POST"), (b":scheme", b"http"), (b":path", path),
                (b":authority", self.authority), (b"content-type", b"application/grpc"), (b"te", b"trailers"),
            ])  # fmt: skip
        return head + metadata + h2c.encode_headers([(b"grpc-timeout", format_timeout(timeout_s))])

    async def start(self, path: bytes, metadata: bytes, timeout_s: float) -> UpstreamCall:
        """A streaming call to ``path`` with ``metadata`` (an encoded block) and ``timeout_s``."""
        return (await self.connection()).start(self._block(path, metadata, timeout_s))

    def unary(
        self, path: bytes, metadata: bytes, timeout_s: float, message: bytes
    ) -> Awaitable[tuple[bytes, Headers, Headers]]:
        """One unary call (message, initial, trailing metadata); no task on a connection already up."""
        block, connection = self._block(path, metadata, timeout_s), self._usable()
        if connection is None:
            return asyncio.ensure_future(self._unary_connecting(block, message))
        return connection.start(block, message).unary_answer()

    async def _unary_connecting(self, block: bytes, message: bytes) -> tuple[bytes, Headers, Headers]:
        return await (await self.connection()).start(block, message).unary_answer()

    async def close(self) -> None:
        for connection in list(self.connections):
            connection.close()
