"""A gRPC front for tritonserver 2.51: the HTTP front's protection for gRPC clients (fault matrix
rows 19–21 and 37–41).

Triton's gRPC frontend accepts messages up to 2 GiB and computes input byte sizes in 64-bit integers:
one 97-byte request (``INT64 [1, 2**61]`` with empty contents) wrapped the check to 0 and killed the
text encoder's stub every time, and a 300 MB request left the server 1.4 GB larger for good. Triton
2.51 has no option to bound either (``tritonserver --help``: no gRPC message size flag). This front
listens where clients connect and forwards every call of ``inference.GRPCInferenceService`` to Triton's
own gRPC port on loopback, unchanged, after:

* a message-size bound (``max_message_bytes``, 64 MiB like the HTTP front's body): larger messages get
  ``RESOURCE_EXHAUSTED`` from gRPC itself before they are buffered whole;
* the checks of each message (``server.fronts.grpc_request``): for ``ModelInfer`` and each message of
  ``ModelStreamInfer``, inputs that carry the bytes their shapes declare and fit their model's config
  (rows 19, 37 and 39: Triton never answered ``[2^62, 0]``); model names without control characters.
  A refused stream message is answered on the stream with its error, as Triton answers its own, and a
  stream message that is no ``ModelInferRequest`` ends the stream with ``INVALID_ARGUMENT`` (row 40);
* system shared memory served here, from the front's own table: Triton never maps a client's file
  (``server.fronts.shm_grpc``; fault matrix rows 24, 43–45 and 49–52);
* a connection must finish its HTTP/2 handshake within 10 s (row 41).

Refusals are ``INVALID_ARGUMENT`` (``PERMISSION_DENIED`` for someone else's file) with a message
naming the input. Everything else passes through as bytes: requests that pass are forwarded as the
client sent them, not re-encoded, unless they name shared memory. While Triton is unreachable, calls
get ``UNAVAILABLE`` and the front logs that once.

Run as ``python -m server.fronts.grpc_front --listen HOST:PORT --upstream HOST:PORT``, with the
admin key in the environment (``server.admin.KEY_ENV``) and the lifetime flags of
``server.fronts.process`` (the launcher passes them).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from tritonclient.grpc import service_pb2

from server.admin import GRPC_ADMIN_HEADER, GRPC_FRONT_HEADER
from server.fronts.client_regions import Client, RegionUse
from server.fronts.grpc_request import SERVICE, check_request, model_to_check, parse_request
from server.fronts.model_shapes import ModelShapesCache
from server.fronts.peer import peer_uid
from server.fronts.process import MIB, admin_key, front_parser, run_front, server_regions
from server.fronts.refusal import RequestRefusedError
from server.fronts.shm_grpc import GrpcSharedMemory, StreamOutputs
from server.fronts.upstream_state import UpstreamState

log = logging.getLogger(__name__)
PREFIX = f"/{SERVICE.full_name}/"
NOT_FORWARDED = ("user-agent", "content-type", "te", "host", GRPC_FRONT_HEADER)
MAX_MESSAGE_BYTES = 64 * MIB
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
    # gRPC backs off up to 2 minutes between reconnects: after Triton starts or restarts, calls would
    # fail fast that long; a second at most
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
# A connection must finish its HTTP/2 preface and SETTINGS within this (grpc's default: 60 s, measured),
# or it is closed (fault matrix row 41): a client could hold 300 half-open connections that long.
HANDSHAKE_TIMEOUT_MS = 10_000
MAX_IDLE_MS = 300_000  # a connection with no call for 5 minutes is closed (GOAWAY: clients reconnect)


class GrpcFront(grpc.GenericRpcHandler):
    """Checks each call of the inference service and forwards it to ``upstream`` as bytes."""

    def __init__(self, upstream: str, key: str, shm: GrpcSharedMemory, listen: str) -> None:
        self.upstream, self.key, self.shm = upstream, key, shm
        host, port = listen.rsplit(":", 1)
        self.local = (host.strip("[]"), int(port))
        self.state = UpstreamState(f"tritonserver's gRPC at {upstream}", log, "UNAVAILABLE")
        self.channel = grpc.aio.insecure_channel(upstream, options=CHANNEL_OPTIONS)
        self.config_call = self.channel.unary_unary(
            PREFIX + "ModelConfig",
            request_serializer=service_pb2.ModelConfigRequest.SerializeToString,
            response_deserializer=service_pb2.ModelConfigResponse.FromString,
        )
        self.shapes = ModelShapesCache(self._model_config)
        self.handlers = {
            method.name: self._handler(method.name, method.client_streaming) for method in SERVICE.methods
        }

    def _handler(self, name: str, streaming: bool) -> grpc.RpcMethodHandler:
        # partials, not lambdas: grpc.aio tells coroutine and async-generator behaviours by inspection
        if streaming:
            upstream_stream = self.channel.stream_stream(PREFIX + name)
            return grpc.stream_stream_rpc_method_handler(functools.partial(self._stream, upstream_stream))
        upstream_call = self.channel.unary_unary(PREFIX + name)
        return grpc.unary_unary_rpc_method_handler(functools.partial(self._unary, name, upstream_call))

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method
        return self.handlers.get(method[len(PREFIX) :]) if method.startswith(PREFIX) else None

    async def _model_config(self, model: str, version: str) -> dict | None:
        """The config Triton serves for ``model``, as a dict, or None when it has none."""
        try:
            answer = await self.config_call(service_pb2.ModelConfigRequest(name=model, version=version))
        except grpc.aio.AioRpcError:
            return None
        return json_format.MessageToDict(answer.config, preserving_proto_field_name=True)

    def _client(self, context: grpc.aio.ServicerContext) -> Client:
        peer = context.peer()  # "ipv4:127.0.0.1:54321" or "ipv6:[::1]:54321"
        uid = None
        if peer.startswith(("ipv4:", "ipv6:")):
            host, _, port = peer.split(":", 1)[1].rpartition(":")
            uid = peer_uid((host.strip("[]"), int(port)), self.local)
        admin = bool(self.key) and dict(context.invocation_metadata()).get(GRPC_ADMIN_HEADER) == self.key
        return Client(uid, admin)

    def _metadata(self, context: grpc.aio.ServicerContext) -> list[tuple[str, str]]:
        kept = [
            (k, v)
            for k, v in context.invocation_metadata()
            if k not in NOT_FORWARDED and not k.startswith((":", "grpc-"))
        ]
        return [*kept, (GRPC_FRONT_HEADER, self.key)] if self.key else kept

    async def _check(
        self, name: str, raw: bytes, context: grpc.aio.ServicerContext
    ) -> tuple[Message | None, list[RegionUse]]:
        """``RequestRefusedError`` unless the call's message passes the checks
        (``server.fronts.grpc_request``); returns it parsed, and the shared-memory ranges it names."""
        request = parse_request(name, raw)
        if request is None:
            return None, []
        wanted = model_to_check(name, request)
        model = await self.shapes.get(*wanted) if wanted else None
        return request, check_request(name, request, model)

    async def _upstream_error(self, error: grpc.aio.AioRpcError, context: grpc.aio.ServicerContext) -> None:
        """Answer the client with Triton's error; note when Triton itself is unreachable."""
        if error.code() == grpc.StatusCode.UNAVAILABLE and "restricted" not in (error.details() or ""):
            self.state.down(error.details())
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, f"tritonserver is not reachable: {error.details()}"
            )
        await context.abort(error.code(), error.details() or "", tuple(error.trailing_metadata() or ()))

    async def _unary(self, name: str, upstream_call, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        client, outputs = None, {}
        try:
            request, uses = await self._check(name, raw, context)
            answer = self.shm.answer(name, request, functools.partial(self._client, context))
            if answer is not None:  # the shared-memory API, served by the front itself
                return answer
            if uses:
                client = self._client(context)
                rewritten, outputs = self.shm.to_triton(client, request)  # Triton never maps it
                raw = rewritten or raw
        except RequestRefusedError as refusal:
            await context.abort(grpc.StatusCode[refusal.kind.grpc_code], str(refusal))
        try:
            answer = await upstream_call(
                raw, metadata=self._metadata(context), timeout=context.time_remaining()
            )
        except grpc.aio.AioRpcError as error:
            await self._upstream_error(error, context)
        self.state.up()
        if name in ("RepositoryModelLoad", "RepositoryModelUnload") and request is not None:
            self.shapes.forget(request.model_name)
        if outputs and client is not None:
            try:
                answer = self.shm.to_client(client, outputs, answer)
            except RequestRefusedError as refusal:
                await context.abort(grpc.StatusCode[refusal.kind.grpc_code], str(refusal))
        return answer

    async def _stream(self, upstream_stream, requests: AsyncIterator[bytes], context) -> AsyncIterator[bytes]:
        """Forward the stream message by message; a refused message gets its error on the stream, and
        one that is not a ``ModelInferRequest`` at all ends the stream with ``INVALID_ARGUMENT`` (there
        is no request to answer; fault matrix row 40)."""
        call = upstream_stream(metadata=self._metadata(context), timeout=context.time_remaining())
        regions = StreamOutputs(self.shm, functools.partial(self._client, context))
        answers: asyncio.Queue = asyncio.Queue()
        finished = object()

        async def send() -> None:
            try:
                await forward_requests()
            except Exception as error:  # the stream ended under us: receive() reports what Triton said
                log.debug("stream to tritonserver ended while sending: %r", error)

        async def forward_requests() -> None:
            async for raw in requests:
                try:
                    request, uses = await self._check("ModelStreamInfer", raw, context)
                    if uses:
                        raw = regions.to_triton(request) or raw  # Triton never maps it
                except RequestRefusedError as refusal:
                    try:
                        request = service_pb2.ModelInferRequest.FromString(raw)
                    except DecodeError:
                        await answers.put(refusal)
                        return
                    answer = service_pb2.ModelStreamInferResponse(error_message=str(refusal))
                    answer.infer_response.id = request.id
                    answer.infer_response.model_name = request.model_name
                    await answers.put(answer.SerializeToString())
                    continue
                await call.write(raw)
            await call.done_writing()

        async def receive() -> None:
            try:
                async for raw in call:
                    await answers.put(regions.to_client(raw))
            except grpc.aio.AioRpcError as error:
                await answers.put(error)
            await answers.put(finished)

        tasks = [asyncio.ensure_future(send()), asyncio.ensure_future(receive())]
        try:
            while (item := await answers.get()) is not finished:
                if isinstance(item, grpc.aio.AioRpcError):
                    await self._upstream_error(item, context)
                if isinstance(item, RequestRefusedError):
                    await context.abort(grpc.StatusCode[item.kind.grpc_code], str(item))
                yield item
        finally:
            for task in tasks:
                task.cancel()
            call.cancel()


async def start_front(
    listen: str, front: GrpcFront, max_message_bytes: int = MAX_MESSAGE_BYTES
) -> Callable[[], Awaitable[None]]:
    """Listen on ``listen``; returns the coroutine function that stops the front."""
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.server_handshake_timeout_ms", HANDSHAKE_TIMEOUT_MS),
            ("grpc.max_connection_idle_ms", MAX_IDLE_MS),
        ]
    )
    server.add_generic_rpc_handlers((front,))
    if server.add_insecure_port(listen) == 0:
        raise OSError(f"gRPC front cannot listen on {listen}")
    await server.start()
    log.info("grpc front on %s -> %s (messages up to %d bytes)", listen, front.upstream, max_message_bytes)

    async def stop() -> None:
        await server.stop(grace=5)
        await front.channel.close()

    return stop


def main(argv: list[str] | None = None) -> None:
    parser = front_parser(
        "python -m server.fronts.grpc_front", __doc__, "host:port of tritonserver's gRPC endpoint"
    )
    parser.add_argument("--max-message-mib", type=int, default=MAX_MESSAGE_BYTES // MIB)
    args = parser.parse_args(argv)
    run_front(
        lambda: start_front(
            args.listen,
            GrpcFront(
                args.upstream,
                admin_key(),
                GrpcSharedMemory(
                    server_regions(args), args.trusted_shared_memory, args.max_message_mib * MIB
                ),
                args.listen,
            ),
            args.max_message_mib * MIB,
        ),
        args,
    )


if __name__ == "__main__":
    main()
