"""An HTTP front for tritonserver 2.51, whose HTTP frontend crashes the whole server on a few small
inputs and answers many faulty ones with 500: every request is bounded and checked here first (the
request target, one reading of headers and JSON, each client's share and each inference's deadline,
the model's allow-list, shared memory from the front's own table) and forwarded with ``FRONT_HEADER``,
without which Triton's own port takes no inference (docs/SERVING.md, "The fronts").

Run as ``python -m server.fronts.http_front --listen HOST:PORT --upstream HOST:PORT``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import re
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import cast

from aiohttp import ClientConnectorError, ClientError, ClientSession, ClientTimeout, TCPConnector, web
from aiohttp.web_protocol import RequestHandler
from multidict import CIMultiDict
from yarl import URL

from server.admin import ADMIN_HEADER, FRONT_HEADER
from server.fronts.allow_list import ModelSignature
from server.fronts.body_checks import DEFAULT_MAX_LARGE, DEFAULT_WORKERS, INLINE_BYTES, BodyCheckers, inflate
from server.fronts.client_connections import (
    ClientConnections,
    close_after_answer,
    peer_address,
)
from server.fronts.client_regions import Client, RegionUse
from server.fronts.kserve_json import check_generate, check_infer, check_json
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
from server.fronts.refusal_log import note_refusal, note_refused
from server.fronts.shm_http import HEADER_LENGTH, SYSTEM_SHM, HttpSharedMemory

log = logging.getLogger(__name__)
Headers = CIMultiDict[str]
HOP_BY_HOP = {
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "transfer-encoding", "upgrade", "host", "content-length", FRONT_HEADER,
    "expect",  # the front answers it (``_continue``) and forwards a body it has whole
}  # fmt: skip
TOKEN = r"[!#$%&'*+.^_`|~0-9a-z-]+"
MEDIA_TYPE = re.compile(f"{TOKEN}/{TOKEN}")
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")
# the routes that run a model: checked against its config (the allow-list), within its deadline
INFER = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?/(?:infer|generate|generate_stream)")
REPOSITORY_CHANGE = re.compile(r"/v2/repository/models/([^/]+)/(?:load|unload)")
QUICK_METHODS = ("GET", "HEAD")  # health, metadata, config, statistics: their own upstream connections
# Triton 2.51 answers HEAD with 405 and a body, which HTTP forbids (fault matrix row 65): a HEAD is
# sent as its GET and aiohttp gives the client the GET's headers alone.
UPSTREAM_METHODS = {"HEAD": "GET"}
# Triton drops the connection on methods its parser does not know (row 67): 405 here instead.
SERVED_METHODS = ("GET", "HEAD", "POST")
# Triton's 500s that are about the request's JSON, never the server: answered as the 400 they are.
REQUEST_FAULTS = re.compile(
    r"Unable to parse|attempt to access JSON|attempt to get members|failed to parse the request JSON"
    r"|Expected JSON object|Unable to set 'classification'|failed to get request params"
)
# the one request target taken: a plain /v2/... path libevhtp cannot read otherwise (it drops
# ``#fragments`` and does not decode), forwarded as checked (fault matrix row 35; "Request targets")
PRINTABLE = re.compile(r"[\x21-\x7e]*")
ESCAPE = re.compile(r"%(?:[0-9A-Fa-f]{2})?")
# what an escape may not stand for: a separator, a dot, the escape character itself, a control byte
FORBIDDEN_ESCAPES = {ord(c) for c in "/\\.#?%"} | set(range(0x20)) | {0x7F}
API_ROOT = "/v2"
IDLE_TIMEOUT_S = 75.0  # a kept-alive connection with no request
UPSTREAM_TIMEOUT_S = 600.0  # a POST that is no inference (a repository load can take minutes)
SHUTDOWN_S = 5.0  # on exit, requests still in flight get this long
# POSTs share the slots (rows 38, 56, 57); GET/HEAD have connections of their own
QUICK_CONNECTIONS = 32
QUICK_TIMEOUT_S = 60.0


def _bad_target(target: str, why: str) -> RequestRefusedError:
    return RequestRefusedError(f"request target {target[:80]!r} {why}; send a plain /v2/... path")


def checked_target(target: str) -> tuple[str, str]:
    """``(path, query)`` of a plain origin-form ``/v2`` target, or ``RequestRefusedError``."""
    path, _, query = target.partition("?")
    for fault, why in (
        (not PRINTABLE.fullmatch(target), "holds a space, control or non-ASCII character"),
        ("#" in target, "has a '#' fragment"),
        ("\\" in target, "has a backslash"),
        (not target.startswith("/"), "is not origin-form (a path starting with '/')"),
        (path != API_ROOT and not path.startswith(API_ROOT + "/"), f"is outside {API_ROOT}"),
    ):
        if fault:
            raise _bad_target(target, why)
    for segment in path.split("/")[1:]:
        if segment == "":
            raise _bad_target(target, "has an empty segment ('//' or a trailing '/')")
        if segment in (".", ".."):
            raise _bad_target(target, f"has a {segment!r} segment")
    for escape in ESCAPE.finditer(path):
        if len(escape.group()) != 3:
            raise _bad_target(target, "has a '%' that starts no two-digit hex escape")
        if int(escape.group()[1:], 16) in FORBIDDEN_ESCAPES:
            why = f"has the escape {escape.group()!r}, a separator, dot or control character"
            raise _bad_target(target, why)
    return path, query


def forwarded_target(path: str, query: str) -> str:
    """The target sent to Triton: the checked path, and the query when there is one."""
    return f"{path}?{query}" if query else path


def _closing_answer(status: str, message: str) -> bytes:
    """A JSON error written straight to a connection that is closed after it."""
    body = json.dumps({"error": message})
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"Connection: close\r\n\r\n{body}"
    ).encode()


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def _continue(request: web.BaseRequest) -> None:
    """``100 Continue`` once the headers passed (row 66): aiohttp's low-level server never sends it."""
    if request.version >= (1, 1) and request.headers.get("Expect", "").lower() == "100-continue":
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")


def _content_type(request: web.BaseRequest) -> str:
    """The media type, read without aiohttp's recursive parser (239 ``(``: row 16)."""
    value = request.headers.get("Content-Type")
    if value is None:
        return ""
    media_type = value.split(";", 1)[0].strip().lower()
    if not MEDIA_TYPE.fullmatch(media_type):
        raise RequestRefusedError(f"Content-Type {value[:40]!r} is not a media type (type/subtype)")
    return media_type


def client_address(request: web.BaseRequest) -> str:
    """The address a request's client is counted and logged by, spelled as its connection's."""
    peer = request.transport.get_extra_info("peername") if request.transport else None
    return peer_address(peer) if peer else request.remote or ""


def forwarded_headers(request: web.BaseRequest) -> Headers:
    """The client's headers, case-insensitively; one sent twice is refused (Triton reads the first)."""
    names = Counter(name.decode("latin-1").lower() for name, _ in request.raw_headers)
    twice = sorted(name for name, count in names.items() if count > 1 and name not in HOP_BY_HOP)
    if twice:
        raise RequestRefusedError(f"header {twice[0]!r} is sent {names[twice[0]]} times; send it once")
    return CIMultiDict((k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP)


class FrontConnection(RequestHandler):
    """aiohttp's handler with a deadline for a request's head (slowloris) and JSON errors."""

    head_timeout_s = 10.0
    _head_timer: asyncio.TimerHandle | None = None
    clients: ClientConnections  # the server's, counting this connection (row 73)
    address = ""
    refused = False  # beyond the client's share of connections: answered 503 and never read

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.address = peer_address(transport.get_extra_info("peername"))
        refusal = self.clients.admit(self.address)
        if refusal is None:
            super().connection_made(transport)
            return
        log.debug("refusing a connection from %s: %s", self.address, refusal)  # fault matrix row 73
        self.refused = True
        cast(asyncio.WriteTransport, transport).write(_closing_answer("503 Service Unavailable", refusal))
        if self.clients.wait_refused(self):
            close_after_answer(transport)
        else:
            transport.close()

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        idle = self._waiter is not None and not self._messages
        super().data_received(data)
        if self._messages:
            self._stop_head_timer()
        elif idle and data and self._head_timer is None:
            self._head_timer = self._loop.call_later(self.head_timeout_s, self._head_expired)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_expired(self) -> None:
        self._head_timer = None
        if self.transport is None or self._messages or self._waiter is None:
            return
        note_refusal("requests whose headers were not whole in time (408, fault matrix row 13)", self.address)
        message = f"request headers not complete within {self.head_timeout_s:g} s"
        self.transport.write(_closing_answer("408 Request Timeout", message))
        self.force_close()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.refused:
            self.clients.refused_gone(self)
            return
        self.clients.release(self.address)
        self._stop_head_timer()
        super().connection_lost(exc)

    def handle_error(
        self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None, message=None
    ) -> web.StreamResponse:
        if status >= 500:  # the front's own failure: worth a traceback
            self.log_exception("HTTP front failed on a request from %s", request.remote, exc_info=exc)
            text = f"the HTTP front failed on this request: {exc!r}"
        else:
            text = "malformed HTTP request: " + " ".join(str(message or exc).split())  # one line
            log.info("%s from %s", text, request.remote)
        response = _error(status, text)
        response.force_close()
        return response


class FrontServer(web.Server):
    """aiohttp's low-level server with ``FrontConnection`` connections (bodies: ``HttpFront._read_body``)."""

    def __init__(self, front: HttpFront, **kwargs) -> None:
        super().__init__(front.handle, **kwargs)
        self.front = front
        # connections, beside a full region table's descriptors
        self.clients = ClientConnections(front.shares.connections, front.shm.descriptors)

    def __call__(self) -> RequestHandler:
        handler = FrontConnection(self, loop=self._loop, **self._kwargs)
        handler.head_timeout_s = self.front.args.header_timeout_s
        handler.clients = self.clients
        return handler


class HttpFront(Front):
    """The request handler: checks, forwards to ``--upstream``, answers."""

    shm: HttpSharedMemory
    regions = HttpSharedMemory

    def __init__(self, args: argparse.Namespace) -> None:
        self.max_body_bytes = args.max_body_mib * MIB  # an inference is bounded by its model's largest too
        state = UpstreamState(f"tritonserver at {args.upstream}", log)
        super().__init__(args, self.max_body_bytes, state)
        self.session: ClientSession | None = None
        self.quick: ClientSession | None = None
        self.checkers = BodyCheckers(args.body_workers, args.max_large_bodies)

    async def open(self) -> None:
        self.checkers.start()

        def session(connections: int, timeout_s: float) -> ClientSession:
            return ClientSession(
                f"http://{self.upstream}",
                connector=TCPConnector(limit=connections),
                timeout=ClientTimeout(total=timeout_s),
                auto_decompress=False,
            )

        # room for the slots' requests and for the overdue ones still running beside them
        self.session = session(self.shares.slots.capacity * 2, UPSTREAM_TIMEOUT_S)
        self.quick = session(QUICK_CONNECTIONS, QUICK_TIMEOUT_S)

    async def close(self) -> None:
        for session in (self.session, self.quick):
            if session is not None:
                await session.close()
        self.checkers.close()

    async def _model_config(self, model: str, version: str) -> dict:
        assert self.quick is not None
        versioned = f"/versions/{version}" if version else ""
        url = URL(f"/v2/models/{model}{versioned}/config", encoded=True)
        try:
            async with self.quick.get(url, headers={"Accept-Encoding": "identity"}) as answer:
                document = await answer.json(content_type=None)
                status = answer.status
        except (TimeoutError, ClientError) as error:
            self.state.down(error)  # logged once, like a forwarded request that finds Triton down
            raise
        self.state.up()
        if status == 200 and isinstance(document, dict):
            return document
        message = document.get("error") if isinstance(document, dict) else None
        if 400 <= status < 500 and isinstance(message, str):
            kind = Refusal.NOT_FOUND if status == 404 else Refusal.INVALID
            raise RequestRefusedError(message, kind)  # Triton's own answer: no such model (version)
        raise ConnectionError(f"tritonserver answered the config of '{model}' with {status}")

    def _client(self, request: web.BaseRequest) -> Client:
        return self.client(request.transport, request.headers.get(ADMIN_HEADER))

    async def _check(
        self, request: web.BaseRequest, path: str, body: bytes, model: ModelSignature | None
    ) -> list[RegionUse]:
        """The checks of the route ``path``; returns the shared-memory ranges an inference names."""
        if request.method != "POST":
            return []
        check = functools.partial(self.checkers.check, len(body))
        if model is not None and path.endswith(("/generate", "/generate_stream")):
            await check(check_generate, body, model)
        elif model is not None:
            return await check(check_infer, body, request.headers.get(HEADER_LENGTH), model)
        elif body:
            await check(check_json, body)  # every other /v2 POST body is JSON: one reading for both
        return []

    async def _read_body(
        self, request: web.BaseRequest, limit: int, what: str, need: Callable[[int | None], None]
    ) -> bytes:
        """The whole body, 413 as soon as it passes ``limit`` (a chunked body has no ``Content-Length``)."""
        chunks, size = [], 0
        async for chunk in request.content.iter_any():
            size += len(chunk)
            if size > limit:
                raise RequestRefusedError(f"request body exceeds {limit} bytes, {what}", Refusal.TOO_LARGE)
            need(size)
            chunks.append(chunk)
        return b"".join(chunks)

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        body_read = False
        try:
            path, query = checked_target(request.raw_path)  # fault matrix row 35
            if request.method not in SERVED_METHODS:
                raise RequestRefusedError("Method Not Allowed", Refusal.NOT_ALLOWED)
            headers = forwarded_headers(request)
            form = _content_type(request) in FORM_TYPES
            infer = INFER.fullmatch(path) if request.method == "POST" else None
            # the config of the model an inference names: never forwarded unchecked
            model = await self.signatures.get(infer[1], infer[2] or "") if infer else None
            limit, what = self.max_body_bytes, "the largest the front takes"
            if model is not None:
                limit = model.largest_request_bytes()
                what = f"the largest request model '{model.model}' takes"
            elif SYSTEM_SHM.fullmatch(path):  # parsed on the event loop
                limit, what = INLINE_BYTES, "the largest a shared-memory call takes"
            declared = request.content_length
            if declared is not None and declared > limit:  # before reading a byte
                raise RequestRefusedError(
                    f"request body of {declared} bytes exceeds {limit}, {what}", Refusal.TOO_LARGE
                )
            with self.checkers.place() as need:
                need(declared)
                await _continue(request)
                reading = self._read_body(request, limit, what, need)
                body = await asyncio.wait_for(reading, self.args.body_timeout_s)
                body_read = True
                body = inflate(body, headers.pop("Content-Encoding", None), limit)
                need(len(body))
                method = UPSTREAM_METHODS.get(request.method, request.method)
                answer = self.shm.answer(method, path, body, lambda: self._client(request))
                if answer is not None:  # the shared-memory API, served by the front itself
                    return answer
                client, outputs = None, None
                if await self._check(request, path, body, model):
                    assert model is not None  # only an inference names regions
                    client = self._client(request)
                    body, outputs = self.shm.to_triton(client, body, headers, model)  # Triton never maps it
        except TimeoutError:
            note_refusal(
                "request bodies not whole in time (408, fault matrix row 6)", client_address(request)
            )
            response = _error(408, f"request body not complete within {self.args.body_timeout_s:g} s")
            response.force_close()
            return response
        except RequestRefusedError as refusal:
            note_refused(refusal, client_address(request))
            response = _error(refusal.kind.http_status, str(refusal))
            if not body_read:  # the body is still on the connection: close it rather than read it
                response.force_close()
            return response
        headers.setdefault("Accept-Encoding", "identity")  # aiohttp would ask for gzip on its own
        if form:
            headers["Content-Type"] = "application/json"  # libevhtp would parse it as a query string
        if self.key:
            headers[FRONT_HEADER] = self.key  # Triton's own port answers inference/shm only with it
        try:
            answer = await self._forward(request, forwarded_target(path, query), headers, body, model)
            if match := REPOSITORY_CHANGE.fullmatch(path):
                self.signatures.forget(match[1])
            if outputs and client is not None:
                return self.shm.to_client(client, outputs, answer)
        except RequestRefusedError as refusal:
            note_refused(refusal, client_address(request))
            return _error(refusal.kind.http_status, str(refusal))
        return answer

    async def _forward(
        self,
        request: web.BaseRequest,
        target: str,
        headers: Headers,
        body: bytes,
        model: ModelSignature | None,
    ) -> web.Response:
        """Send ``target`` upstream: GET/HEAD apart, the rest in the client's share and deadline. A hang-up
        cancels a POST that is no inference, not an inference Triton has (``Deadlines.within``, row 38)."""
        if request.method in QUICK_METHODS:
            assert self.quick is not None
            return await self._exchange(self.quick, request.method, target, headers, body)
        assert self.session is not None
        peer = request.transport.get_extra_info("peername") if request.transport else None
        address = client_address(request)
        connection = f"{peer[0]}:{peer[1]}" if peer else address
        exchange = functools.partial(self._exchange, self.session, request.method, target, headers, body)
        if model is None:
            async with self.slots.held(address, connection):
                return await exchange()
        deadline = model.deadline_s or self.shares.deadline_s
        return await self.deadlines.within(address, connection, model.model, deadline, exchange)

    async def _exchange(
        self, session: ClientSession, method: str, target: str, headers: Headers, body: bytes
    ) -> web.Response:
        url = URL(target, encoded=True)
        try:
            async with session.request(
                UPSTREAM_METHODS.get(method, method), url, data=body, headers=headers, allow_redirects=False
            ) as answer:
                payload = await answer.read()
                status = answer.status
                kept = CIMultiDict((k, v) for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP)
        except ClientConnectorError as error:
            self.state.down(error)
            return _error(503, f"tritonserver is not reachable (starting, restarting or down): {error}")
        except (TimeoutError, ClientError) as error:
            self.state.down(error)
            return _error(502, f"tritonserver did not answer the request (it may have crashed): {error!r}")
        self.state.up()
        if status == 500 and REQUEST_FAULTS.search(payload.decode(errors="replace")):
            status = 400
        return web.Response(status=status, body=payload, headers=kept)


async def start_front(front: HttpFront) -> Callable[[], Awaitable[None]]:
    """Listen on ``--listen`` (``host:port``); returns the coroutine function that stops the front."""
    host, port = front.args.listen.rsplit(":", 1)
    await front.open()
    server = FrontServer(
        front,
        # a client that hangs up ends its body's read and its wait for a slot, not the inference Triton
        # already has (``_forward``, row 38)
        handler_cancellation=True,
        keepalive_timeout=IDLE_TIMEOUT_S,
        auto_decompress=False,
        access_log=None,
    )
    runner = web.ServerRunner(server, shutdown_timeout=SHUTDOWN_S)
    await runner.setup()
    await web.TCPSite(runner, host, int(port)).start()
    log.info("http front on %s -> %s", front.args.listen, front.upstream)

    async def stop() -> None:
        # kept-alive upstream connections would hold tritonserver's exit for its exit timeout
        await runner.cleanup()
        await front.close()

    return stop


def main(argv: list[str] | None = None) -> None:
    parser = front_parser(
        "python -m server.fronts.http_front", __doc__, "host:port of tritonserver's HTTP endpoint"
    )
    parser.add_argument("--max-body-mib", type=positive(int), default=MAX_REQUEST_BYTES // MIB)
    parser.add_argument("--body-timeout-s", type=positive(float), default=30.0)
    parser.add_argument("--header-timeout-s", type=positive(float), default=10.0)
    parser.add_argument(
        "--body-workers",
        type=int,
        default=DEFAULT_WORKERS,
        help="processes that check request bodies above 256 KiB off the event loop",
    )
    parser.add_argument(
        "--max-large-bodies",
        type=positive(int),
        default=DEFAULT_MAX_LARGE,
        help="large bodies read or checked at once (429 beyond: send binary tensor data)",
    )
    run_front(parser, argv, lambda args: start_front(HttpFront(args)))


if __name__ == "__main__":
    main()
