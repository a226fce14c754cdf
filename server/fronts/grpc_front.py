"""A gRPC front for tritonserver 2.51, whose gRPC takes messages up to 2 GiB and wraps input byte sizes
in 64 bits (97 bytes of ``INT64 [1, 2**61]`` killed a stub): every call of the inference service is
bounded and checked as the HTTP front checks requests (``grpc_request``, ``shm_grpc``, deadlines and
shares, the wire bounds of ``grpc_wire``) and forwarded as the client's bytes (docs/SERVING.md, "The
fronts"). It speaks HTTP/2 itself (``h2c``): a grpc.aio relay cost 1.26 ms of CPU a request.

Run as ``python -m server.fronts.grpc_front --listen HOST:PORT --upstream HOST:PORT``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from tritonclient.grpc import service_pb2

from server.admin import GRPC_ADMIN_HEADER, GRPC_FRONT_HEADER
from server.fronts import h2c
from server.fronts.allow_list import ModelSignature
from server.fronts.client_connections import ClientConnections
from server.fronts.client_regions import Client, RegionUse
from server.fronts.client_slots import (
    IDLE_TIMEOUT_S,
    MESSAGE_TIMEOUT_S,
    OVERDUE_TIMEOUT_S,
    STREAM_WATCH_S,
    StreamWaits,
)
from server.fronts.grpc_request import SERVICE, check_request, model_to_check, parse_request
from server.fronts.grpc_upstream import Upstream, UpstreamCall
from server.fronts.grpc_wire import (
    LARGE_MESSAGES,
    STATUS,
    UNAVAILABLE,
    ConnectionLimits,
    FrontConnection,
    GrpcError,
    IncomingBytes,
    ServerCall,
)
from server.fronts.process import (
    MAX_REQUEST_BYTES,
    MIB,
    Front,
    UpstreamState,
    front_parser,
    positive,
    run_front,
)
from server.fronts.refusal import Refusal, RequestRefusedError
from server.fronts.refusal_log import note_refused
from server.fronts.shm_grpc import GrpcSharedMemory, StreamOutputs

log = logging.getLogger(__name__)
PREFIX = f"/{SERVICE.full_name}/"
ADMIN_KEY = GRPC_ADMIN_HEADER.encode()
NOT_FORWARDED = (b"user-agent", b"content-type", b"te", b"host", GRPC_FRONT_HEADER.encode())
# a connection's HTTP/2 handshake must be done within this (fault matrix row 41; grpc's own: 60 s)
HANDSHAKE_TIMEOUT_S = 10.0
CONFIG_PATH = f"{PREFIX}ModelConfig".encode()
CONFIG_TIMEOUT_S = 5.0
STOP_GRACE_S = 5.0
# Triton's answers for a model it has no config for: passed on as they are, in its words
TRITON_REFUSALS = {STATUS["NOT_FOUND"]: Refusal.NOT_FOUND, STATUS["INVALID_ARGUMENT"]: Refusal.INVALID}
LOADS = ("RepositoryModelLoad", "RepositoryModelUnload")
METADATA_BLOCKS = 1024  # encoded metadata blocks kept (clients send the same few)


@functools.lru_cache(maxsize=METADATA_BLOCKS)
def _metadata_block(kept: tuple[tuple[bytes, bytes], ...], front_key: bytes) -> bytes:
    return h2c.encode_headers(list(kept)) + front_key


def _refused(refusal: RequestRefusedError, call: ServerCall) -> GrpcError:
    """``refusal`` as the call's status, counted in the front's log when a bound of the front made it."""
    note_refused(refusal, call.connection.address)
    return GrpcError(STATUS[refusal.kind.grpc_code], str(refusal))


class GrpcFront(Front):
    """Checks each call of the inference service and forwards it to ``--upstream`` as bytes."""

    shm: GrpcSharedMemory
    regions = GrpcSharedMemory

    def __init__(self, args: argparse.Namespace) -> None:
        self.max_message_bytes = args.max_message_mib * MIB  # any call; an inference's model bounds it too
        state = UpstreamState(f"tritonserver's gRPC at {args.upstream}", log, "UNAVAILABLE")
        super().__init__(args, self.max_message_bytes, state)
        self.triton = Upstream(self.upstream)
        self.methods = {method.name: method.client_streaming for method in SERVICE.methods}
        self.connections: set[FrontConnection] = set()
        self.limits = ConnectionLimits(
            self.max_message_bytes,
            HANDSHAKE_TIMEOUT_S,
            args.idle_timeout_s,
            IncomingBytes(LARGE_MESSAGES * self.max_message_bytes),
            ClientConnections(self.shares.connections, self.shm.descriptors),
            args.message_timeout_s,
        )
        key = self.key.encode()
        self.front_key = h2c.encode_headers([(GRPC_FRONT_HEADER.encode(), key)]) if key else b""

    def connection(self) -> FrontConnection:
        """A new client connection (the listening socket's protocol factory)."""
        return FrontConnection(self.limits, self.methods, PREFIX, self.serve, self.connections)

    async def serve(self, call: ServerCall) -> None:
        await (self._stream if call.streaming else self._unary)(call)

    async def _model_config(self, model: str, version: str) -> dict:
        request = service_pb2.ModelConfigRequest(name=model, version=version).SerializeToString()
        try:
            raw, _, _ = await self.triton.unary(CONFIG_PATH, b"", CONFIG_TIMEOUT_S, request)
        except GrpcError as error:
            refusal = TRITON_REFUSALS.get(error.code)
            if refusal is not None:
                raise RequestRefusedError(error.details, refusal) from error
            if error.code == UNAVAILABLE:
                self.state.down(error)
            raise
        self.state.up()
        answer = service_pb2.ModelConfigResponse.FromString(raw)
        return json_format.MessageToDict(answer.config, preserving_proto_field_name=True)

    def _client(self, call: ServerCall) -> Client:
        sent = next((value for name, value in call.metadata if name == ADMIN_KEY), None)
        return self.client(call.connection.transport, sent and sent.decode(errors="replace"))

    def _metadata(self, call: ServerCall) -> bytes:
        """The client's metadata as Triton gets it (encoded), less gRPC's own, with the front's key."""
        kept = tuple(
            (name, value)
            for name, value in call.metadata
            if name not in NOT_FORWARDED and not name.startswith(b"grpc-")
        )
        return _metadata_block(kept, self.front_key)

    async def _check(
        self, name: str, raw: bytes
    ) -> tuple[Message | None, ModelSignature | None, list[RegionUse]]:
        """The message parsed, its model's config and the ranges it names, or ``RequestRefusedError``."""
        request = parse_request(name, raw)
        if request is None:
            return None, None, []
        wanted = model_to_check(name, request)
        model = await self.signatures.get(*wanted) if wanted else None
        if model is not None and len(raw) > model.largest_request_bytes():
            raise RequestRefusedError(
                f"message of {len(raw)} bytes exceeds {model.largest_request_bytes()}, the largest request "
                f"model '{model.model}' takes",
                Refusal.TOO_LARGE,
            )
        return request, model, check_request(name, request, model)

    def _upstream_error(self, error: GrpcError) -> GrpcError:
        """Triton's error as the client gets it; notes when Triton itself is unreachable."""
        if error.code == UNAVAILABLE and "restricted" not in error.details:
            self.state.down(error)
            if not error.details.startswith("tritonserver is not reachable"):
                return GrpcError(UNAVAILABLE, f"tritonserver is not reachable: {error.details}")
        return error

    def _upstream_timeout(self, call: ServerCall) -> float:
        """The client's own deadline, at most ``OVERDUE_TIMEOUT_S``."""
        if call.deadline is None:
            return OVERDUE_TIMEOUT_S
        return min(call.deadline - call.connection.loop.time(), OVERDUE_TIMEOUT_S)

    async def _unary(self, call: ServerCall) -> None:
        name, raw = call.method, call.message()
        client, outputs, request = None, {}, None
        try:
            request, model, uses = await self._check(name, raw)
            answer = self.shm.answer(name, request, functools.partial(self._client, call))
            if answer is not None:  # the shared-memory API, served by the front itself
                call.reply(answer)
                return
            if uses:
                assert model is not None  # an inference: check_request needs its config
                client = self._client(call)
                rewritten, outputs = self.shm.to_triton(client, request, model)  # Triton never maps it
                raw = rewritten or raw
            path, timeout_s = (PREFIX + name).encode(), self._upstream_timeout(call)
            exchange = functools.partial(self.triton.unary, path, self._metadata(call), timeout_s, raw)
            if model is None:  # answered at once; a reset still lets a load reach ``forget`` (row 79)
                call.forwarded = True
                answer, initial, trailing = await exchange()
            else:  # a reset reaches Triton; ``within`` keeps the slot until Triton has passed it (row 78)
                deadline = model.deadline_s or self.shares.deadline_s
                answer, initial, trailing = await self.deadlines.within(
                    call.connection.address,
                    call.connection.name,
                    model.model,
                    deadline,
                    exchange,
                    cancel_passes_on=True,
                )
            self.state.up()
            if name in LOADS and request is not None:
                self.signatures.forget(request.model_name)
            if outputs and client is not None:
                answer = self.shm.to_client(client, outputs, answer)
        except RequestRefusedError as refusal:
            raise _refused(refusal, call) from None
        except GrpcError as error:
            raise self._upstream_error(error) from None
        call.reply(answer, initial, trailing)

    async def _stream(self, call: ServerCall) -> None:
        """A stream holds one slot for its life (waiting for it at most the front's deadline)."""
        connection = call.connection
        try:
            async with self.slots.held(connection.address, connection.name, wait_s=self.shares.deadline_s):
                try:
                    upstream = await self.triton.start(
                        (PREFIX + call.method).encode(), self._metadata(call), self._upstream_timeout(call)
                    )
                except GrpcError as error:
                    raise self._upstream_error(error) from None
                call.forwarded = True  # a reset ends what it sends, not what Triton runs (row 78)
                await self._relay(call, upstream)
        except RequestRefusedError as refusal:
            raise _refused(refusal, call) from None

    async def _relay(self, call: ServerCall, upstream: UpstreamCall) -> None:
        """Forward a stream: a refused message gets its error, no ``ModelInferRequest`` ends it (row 40)."""
        regions = StreamOutputs(self.shm, functools.partial(self._client, call))
        answers: asyncio.Queue = asyncio.Queue()
        waiting = StreamWaits(self.shares.slots.per_connection)
        finished = object()

        async def forward_requests() -> None:
            while (raw := await call.receive()) is not None:
                try:
                    request, model, uses = await self._check("ModelStreamInfer", raw)
                    assert model is not None
                    waiting.check_room()  # before any region is read
                    if uses:
                        raw = regions.to_triton(request, model) or raw  # Triton never maps it
                    # under the id Triton answers with (the front's own when outputs go to regions)
                    waiting.add(request, model.deadline_s or self.shares.deadline_s)
                except RequestRefusedError as refusal:
                    try:
                        request = service_pb2.ModelInferRequest.FromString(raw)
                    except DecodeError:
                        await answers.put(refusal)
                        return
                    note_refused(refusal, call.connection.address)  # the stream goes on: one message refused
                    answer = service_pb2.ModelStreamInferResponse(error_message=str(refusal))
                    answer.infer_response.id = request.id
                    answer.infer_response.model_name = request.model_name
                    await answers.put(answer.SerializeToString())
                    continue
                upstream.write(raw)
            upstream.done_writing()

        async def receive() -> None:
            try:
                async for raw in upstream.answers():
                    waiting.answered(raw)
                    await answers.put(regions.to_client(raw))
            except GrpcError as error:
                await answers.put(error)
            await answers.put(finished)

        async def watch() -> None:
            while (late := waiting.overdue()) is None:
                await asyncio.sleep(STREAM_WATCH_S)
            await answers.put(late)

        tasks = [asyncio.ensure_future(job()) for job in (forward_requests, receive, watch)]
        try:
            while (item := await answers.get()) is not finished:
                if isinstance(item, GrpcError):
                    raise self._upstream_error(item)
                if isinstance(item, RequestRefusedError):
                    raise _refused(item, call)
                call.send_message(item)
        finally:
            for task in tasks:
                task.cancel()
            upstream.cancel()


async def start_front(front: GrpcFront) -> Callable[[], Awaitable[None]]:
    """Listen on ``--listen`` (``host:port``); returns the coroutine function that stops the front."""
    listen, limit = front.args.listen, front.max_message_bytes
    host, port = listen.rsplit(":", 1)
    try:
        server = await asyncio.get_running_loop().create_server(
            front.connection, host.strip("[]") or None, int(port), reuse_address=True
        )
    except OSError as error:
        raise OSError(f"gRPC front cannot listen on {listen}: {error}") from error
    log.info("grpc front on %s -> %s (messages up to %d bytes)", listen, front.upstream, limit)

    async def stop() -> None:
        server.close()
        for connection in list(front.connections):
            connection.close_gracefully()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STOP_GRACE_S):
                while any(connection.calls for connection in front.connections):
                    await asyncio.sleep(0.05)
        for connection in list(front.connections):
            connection.close()
        await front.triton.close()

    return stop


def main(argv: list[str] | None = None) -> None:
    parser = front_parser(
        "python -m server.fronts.grpc_front", __doc__, "host:port of tritonserver's gRPC endpoint"
    )
    parser.add_argument("--max-message-mib", type=positive(int), default=MAX_REQUEST_BYTES // MIB)
    parser.add_argument(
        "--message-timeout-s",
        type=positive(float),
        default=MESSAGE_TIMEOUT_S,
        help="a message must be whole this many seconds after a unary call starts or a stream's message "
        "begins (DEADLINE_EXCEEDED after)",
    )
    parser.add_argument(
        "--idle-timeout-s",
        type=positive(float),
        default=IDLE_TIMEOUT_S,
        help="a connection without calls is closed, and a stream that sent no message ended, after this "
        "many seconds",
    )
    # the front is made inside the event loop: its connections belong to that loop
    run_front(parser, argv, lambda args: start_front(GrpcFront(args)))


if __name__ == "__main__":
    main()
