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
  ``ModelStreamInfer``, inputs that carry the bytes their shapes declare (rows 19, 37 and 39: Triton
  never answered ``[2^62, 0]``) in a request its model's config accepts, exactly
  (``server.fronts.allow_list``; rows 53–55), whatever carries the inputs; an unknown model is refused
  with Triton's ``NOT_FOUND``, never forwarded unchecked; model names without control characters. A
  refused stream message is answered on the stream with its error, as Triton answers its own, and a
  stream message that is no ``ModelInferRequest`` ends the stream with ``INVALID_ARGUMENT`` (row 40);
* system shared memory served here, from the front's own table: Triton never maps a client's file
  (``server.fronts.shm_grpc``; fault matrix rows 24, 43–45 and 49–52); the bytes are read from the
  client's region only once the request passed the allow-list, and walked by it before Triton sees them
  (row 61);
* deadlines and client shares: an inference call is answered within its model's deadline
  (``DEADLINE_EXCEEDED`` after; ``server.fronts.deadlines``, row 56) and a client connection and
  address may each have a share of the calls waiting on Triton (``RESOURCE_EXHAUSTED`` beyond;
  ``server.fronts.client_slots``, row 57); a stream holds one slot and bounds its waiting messages;
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
from dataclasses import dataclass, field

import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from tritonclient.grpc import service_pb2

from server.admin import GRPC_ADMIN_HEADER, GRPC_FRONT_HEADER
from server.fronts.allow_list import ModelSignature
from server.fronts.client_regions import Client, RegionUse
from server.fronts.client_slots import ClientSlots
from server.fronts.deadlines import OVERDUE_TIMEOUT_S, Overdue, within_deadline
from server.fronts.grpc_request import SERVICE, check_request, model_to_check, parse_request
from server.fronts.model_shapes import ModelSignatures
from server.fronts.peer import peer_uid
from server.fronts.process import (
    MAX_REQUEST_BYTES,
    MIB,
    FrontShares,
    add_share_arguments,
    admin_key,
    front_parser,
    run_front,
    server_regions,
    shares_from_args,
)
from server.fronts.refusal import Refusal, RequestRefusedError
from server.fronts.shm_grpc import GrpcSharedMemory, StreamOutputs
from server.fronts.stream_waits import STREAM_WATCH_S, StreamWaits
from server.fronts.upstream_state import UpstreamState

log = logging.getLogger(__name__)
PREFIX = f"/{SERVICE.full_name}/"
NOT_FORWARDED = ("user-agent", "content-type", "te", "host", GRPC_FRONT_HEADER)
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
# Triton's answers for a model it has no config for: passed on as they are, in its words
TRITON_REFUSALS = {
    grpc.StatusCode.NOT_FOUND: Refusal.NOT_FOUND,
    grpc.StatusCode.INVALID_ARGUMENT: Refusal.INVALID,
}
# Calls received but not yet taken up by the front's event loop: beyond grpc's default of 1,000 it
# cancels new calls at random (CANCELLED, measured with 2,000 sent at once on one connection), which no
# client can tell from a failure. Up to this many wait instead, and the client shares
# (``server.fronts.client_slots``) refuse what is beyond a client's share as RESOURCE_EXHAUSTED.
MAX_PENDING_CALLS = 20_000
MAX_IDLE_MS = 300_000  # a connection with no call for 5 minutes is closed (GOAWAY: clients reconnect)


@dataclass(frozen=True)
class GrpcLimits:
    max_message_bytes: int = MAX_REQUEST_BYTES  # any call; an inference is bounded by its model's too
    shares: FrontShares = field(default_factory=FrontShares)  # inference calls (a stream: one slot)


def _peer(context: grpc.aio.ServicerContext) -> tuple[str, str, int | None]:
    """(address, connection, port) of the caller, as the client shares and the shared-memory table
    know it: ``ipv4:127.0.0.1:54321`` is address ``127.0.0.1``, port 54321; ``ipv6:[::1]:54321``
    address ``::1`` (a caller not on TCP: its whole peer string, no port)."""
    peer = context.peer() or ""
    if not peer.startswith(("ipv4:", "ipv6:")):
        return peer, peer, None
    host, _, port = peer.split(":", 1)[1].rpartition(":")
    return host.strip("[]"), peer, int(port)


class GrpcFront(grpc.GenericRpcHandler):
    """Checks each call of the inference service and forwards it to ``upstream`` as bytes."""

    def __init__(
        self,
        upstream: str,
        key: str,
        shm: GrpcSharedMemory,
        listen: str,
        limits: GrpcLimits | None = None,
    ) -> None:
        self.upstream, self.key, self.shm = upstream, key, shm
        self.limits = limits or GrpcLimits()
        host, port = listen.rsplit(":", 1)
        self.local = (host.strip("[]"), int(port))
        self.state = UpstreamState(f"tritonserver's gRPC at {upstream}", log, "UNAVAILABLE")
        self.channel = grpc.aio.insecure_channel(upstream, options=CHANNEL_OPTIONS)
        self.config_call = self.channel.unary_unary(
            PREFIX + "ModelConfig",
            request_serializer=service_pb2.ModelConfigRequest.SerializeToString,
            response_deserializer=service_pb2.ModelConfigResponse.FromString,
        )
        self.signatures = ModelSignatures(self._model_config, self.limits.max_message_bytes)
        self.slots = ClientSlots(self.limits.shares.slots)
        self.overdue = Overdue(self.limits.shares.max_overdue)
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

    async def _model_config(self, model: str, version: str) -> dict:
        """The config Triton serves for ``model``, as a dict, or Triton's refusal when it has none."""
        try:
            answer = await self.config_call(service_pb2.ModelConfigRequest(name=model, version=version))
        except grpc.aio.AioRpcError as error:
            if error.code() in TRITON_REFUSALS:
                raise RequestRefusedError(error.details() or "", TRITON_REFUSALS[error.code()]) from error
            if error.code() == grpc.StatusCode.UNAVAILABLE:
                self.state.down(error.details())
            raise
        self.state.up()
        return json_format.MessageToDict(answer.config, preserving_proto_field_name=True)

    def _client(self, context: grpc.aio.ServicerContext) -> Client:
        address, _, port = _peer(context)
        uid = None if port is None else peer_uid((address, port), self.local)
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
    ) -> tuple[Message | None, ModelSignature | None, list[RegionUse]]:
        """``RequestRefusedError`` unless the call's message passes the checks
        (``server.fronts.grpc_request``); returns it parsed, with its model's config for an inference
        (whose message must also be no larger than the model's largest valid request) and the
        shared-memory ranges it names."""
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

    async def _upstream_error(self, error: grpc.aio.AioRpcError, context: grpc.aio.ServicerContext) -> None:
        """Answer the client with Triton's error; note when Triton itself is unreachable."""
        if error.code() == grpc.StatusCode.UNAVAILABLE and "restricted" not in (error.details() or ""):
            self.state.down(error.details())
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, f"tritonserver is not reachable: {error.details()}"
            )
        await context.abort(error.code(), error.details() or "", tuple(error.trailing_metadata() or ()))

    def _upstream_timeout(self, context: grpc.aio.ServicerContext) -> float:
        """How long a call may wait on Triton: the client's own deadline, at most ``OVERDUE_TIMEOUT_S``
        (an overdue call runs on until Triton answers it, not for ever)."""
        remaining = context.time_remaining()
        return OVERDUE_TIMEOUT_S if remaining is None else min(remaining, OVERDUE_TIMEOUT_S)

    async def _unary(self, name: str, upstream_call, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        client, outputs = None, {}
        try:
            request, model, uses = await self._check(name, raw, context)
            answer = self.shm.answer(name, request, functools.partial(self._client, context))
            if answer is not None:  # the shared-memory API, served by the front itself
                return answer
            if uses:
                assert model is not None  # an inference: check_request needs its config
                client = self._client(context)
                rewritten, outputs = self.shm.to_triton(client, request, model)  # Triton never maps it
                raw = rewritten or raw
            call = functools.partial(
                upstream_call, raw, metadata=self._metadata(context), timeout=self._upstream_timeout(context)
            )
            if model is None:
                answer = await call()
            else:
                address, connection, _ = _peer(context)
                deadline = model.deadline_s or self.limits.shares.deadline_s
                answer = await within_deadline(
                    self.slots, address, connection, self.overdue, model.model, deadline, call
                )
        except RequestRefusedError as refusal:
            await context.abort(grpc.StatusCode[refusal.kind.grpc_code], str(refusal))
        except grpc.aio.AioRpcError as error:
            await self._upstream_error(error, context)
        self.state.up()
        if name in ("RepositoryModelLoad", "RepositoryModelUnload") and request is not None:
            self.signatures.forget(request.model_name)
        if outputs and client is not None:
            try:
                answer = self.shm.to_client(client, outputs, answer)
            except RequestRefusedError as refusal:
                await context.abort(grpc.StatusCode[refusal.kind.grpc_code], str(refusal))
        return answer

    async def _stream(self, upstream_stream, requests: AsyncIterator[bytes], context) -> AsyncIterator[bytes]:
        """A stream holds one slot for its life (``wait_s``: the front's deadline to get one); see
        ``_relay`` for its messages."""
        address, connection, _ = _peer(context)
        try:
            async with self.slots.held(address, connection, wait_s=self.limits.shares.deadline_s):
                async for answer in self._relay(upstream_stream, requests, context):
                    yield answer
        except RequestRefusedError as refusal:
            await context.abort(grpc.StatusCode[refusal.kind.grpc_code], str(refusal))

    async def _relay(self, upstream_stream, requests: AsyncIterator[bytes], context) -> AsyncIterator[bytes]:
        """Forward the stream message by message; a refused message gets its error on the stream, and
        one that is not a ``ModelInferRequest`` at all ends the stream with ``INVALID_ARGUMENT`` (there
        is no request to answer; fault matrix row 40). At most ``per_connection`` messages wait for
        their answer (the next gets an error on the stream), and a message its model does not answer
        within its deadline ends the stream with ``DEADLINE_EXCEEDED`` (Triton drops what the ended
        call still had queued)."""
        call = upstream_stream(metadata=self._metadata(context), timeout=self._upstream_timeout(context))
        regions = StreamOutputs(self.shm, functools.partial(self._client, context))
        answers: asyncio.Queue = asyncio.Queue()
        waiting = StreamWaits(self.limits.shares.slots.per_connection)
        finished = object()

        async def send() -> None:
            try:
                await forward_requests()
            except Exception as error:  # the stream ended under us: receive() reports what Triton said
                log.debug("stream to tritonserver ended while sending: %r", error)

        async def forward_requests() -> None:
            async for raw in requests:
                try:
                    request, model, uses = await self._check("ModelStreamInfer", raw, context)
                    assert model is not None
                    waiting.check_room()  # before any region is read
                    if uses:
                        raw = regions.to_triton(request, model) or raw  # Triton never maps it
                    # under the id Triton answers with (the front's own when outputs go to regions)
                    waiting.add(request, model.deadline_s or self.limits.shares.deadline_s)
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
                    waiting.answered(raw)
                    await answers.put(regions.to_client(raw))
            except grpc.aio.AioRpcError as error:
                await answers.put(error)
            await answers.put(finished)

        async def watch() -> None:
            while True:
                await asyncio.sleep(STREAM_WATCH_S)
                late = waiting.overdue()
                if late is not None:
                    await answers.put(late)
                    return

        tasks = [asyncio.ensure_future(job()) for job in (send, receive, watch)]
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


async def start_front(listen: str, front: GrpcFront) -> Callable[[], Awaitable[None]]:
    """Listen on ``listen``; returns the coroutine function that stops the front."""
    max_message_bytes = front.limits.max_message_bytes
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.server_handshake_timeout_ms", HANDSHAKE_TIMEOUT_MS),
            ("grpc.max_connection_idle_ms", MAX_IDLE_MS),
            ("grpc.server.max_pending_requests", MAX_PENDING_CALLS),
            ("grpc.server.max_pending_requests_hard_limit", MAX_PENDING_CALLS),
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
    parser.add_argument("--max-message-mib", type=int, default=MAX_REQUEST_BYTES // MIB)
    add_share_arguments(parser)
    args = parser.parse_args(argv)
    limits = GrpcLimits(args.max_message_mib * MIB, shares_from_args(args))
    shm = GrpcSharedMemory(server_regions(args), limits.max_message_bytes, args.trusted_shared_memory)
    run_front(  # the front is made inside the event loop: its channel belongs to that loop
        lambda: start_front(args.listen, GrpcFront(args.upstream, admin_key(), shm, args.listen, limits)),
        args,
    )


if __name__ == "__main__":
    main()
