"""An HTTP front for tritonserver 2.51: bounds and checks each request before Triton's own HTTP
frontend sees it, because that frontend crashes the whole server on a few small inputs (the
fault matrix's HTTP-front rows, docs/SERVING.md) and blames the server (500) for many faulty ones:

* the request target: only a plain origin-form ``/v2/...`` path, and Triton gets the path that was
  checked, never the raw target (``server.fronts.request_target``; fault matrix row 35); only the
  methods Triton serves, a HEAD answered as its GET without a body (rows 65 and 67);
* upstream slots: a client connection and a client address may each have a share of the requests
  waiting on Triton (429 beyond), a free slot goes to the waiting address holding the fewest
  (``server.fronts.client_slots``), GET/HEAD have connections of their own, and a client that hangs
  up cancels its upstream request (rows 38 and 57);
* deadlines: an inference is answered within its model's deadline, 504 after it
  (``server.fronts.deadlines``; row 56);
* framing: a body above what its route accepts (an inference: the largest valid request of its
  model, ``server.fronts.allow_list``; else ``max_body_bytes``) is refused with 413 from its
  ``Content-Length`` before it is read, a chunked one as it arrives; each whole body is buffered (408
  after ``body_timeout_s``) and a request's headers must be complete within ``header_timeout_s`` of
  their first byte (408; slowloris); pipelined requests are answered in order; a large body is
  checked in a worker process (``server.fronts.body_checks``; row 59);
* one reading: a header Triton reads (``Inference-Header-Content-Length``, ``Content-Type``, ...)
  sent twice (in any cases), a JSON key sent twice, or a number only one parser can hold is a 400, so
  the front and Triton can never check and run two different requests (``server.fronts.kserve_json``);
  a header the front sets or drops is the client's one whatever case its name is sent in;
* ``Content-Encoding: gzip|deflate`` bodies are inflated here, bounded by ``max_body_bytes``, and
  forwarded plain (415 for other encodings, 400 for a body that does not inflate);
* a form-encoded body (``curl -d``) is forwarded as ``application/json``, which it is on every ``/v2``
  route (libevhtp would parse it as a query string and segfault);
* inference JSON is checked field by field (400 naming the field where Triton says 500), no input
  may declare more elements than bytes carry it (``server.fronts.tensor_limits``; row 37), and the
  request must be one its model's config accepts, exactly (``server.fronts.allow_list`` against the
  config Triton serves, ``server.fronts.model_shapes``; rows 53–55): an unknown model is refused with
  Triton's 404, never forwarded unchecked;
* system shared memory is served here, from the front's own table: Triton never maps a client's file
  (``server.fronts.shm_http``, ``server.fronts.client_regions``; fault matrix rows 24, 43–45, 49–52);
  an inference's shared-memory inputs pass the same allow-list as any other, before the front reads
  a byte of the client's region, and the bytes it reads are walked by it before Triton sees them
  (row 61);
* when Triton is unreachable, clients get JSON they can parse: 503 while it is down or starting, 502
  when it drops a request, and the front logs that once, not once per request.

Triton's own HTTP port listens on loopback, with the inference API restricted to requests carrying
``FRONT_HEADER`` (which only the fronts add) and its shared-memory API to the admin key, so the checks
cannot be bypassed by connecting to it. Errors use Triton's shape, ``{"error": "..."}``, so
tritonclient reports them like Triton's. Costs: one extra loopback hop and a JSON parse per inference
request.

Run as ``python -m server.fronts.http_front --listen HOST:PORT --upstream HOST:PORT``, with the
admin key in the environment (``KEY_ENV``) and the lifetime flags of ``server.fronts.process`` (the
launcher passes them: the front follows its tritonserver across restarts and exits once both are gone).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import ClientConnectorError, ClientError, ClientSession, ClientTimeout, TCPConnector, web
from aiohttp.web_protocol import RequestHandler
from multidict import CIMultiDict
from yarl import URL

from server.admin import ADMIN_HEADER, FRONT_HEADER
from server.fronts.allow_list import ModelSignature
from server.fronts.body_checks import (
    DEFAULT_MAX_LARGE,
    DEFAULT_WORKERS,
    INLINE_BYTES,
    BodyCheckers,
)
from server.fronts.body_encoding import inflate
from server.fronts.client_regions import Client, RegionUse
from server.fronts.client_slots import ClientSlots
from server.fronts.deadlines import Deadlines
from server.fronts.kserve_json import check_generate, check_infer, check_json
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
from server.fronts.request_target import checked_target, forwarded_target
from server.fronts.shm_http import SYSTEM_SHM, HttpSharedMemory
from server.fronts.upstream_state import UpstreamState

log = logging.getLogger(__name__)
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
# Triton 2.51 answers HEAD on every route with 405 and a body, which HTTP forbids (a HEAD answer ends
# at its headers): the front read that body as the next answer's status line and answered 502 (fault
# matrix row 65). A HEAD is its GET without the body (RFC 9110, 9.3.2), so Triton is asked the GET,
# and aiohttp sends the client the GET's status and headers alone; the front's own routes (shared
# memory) answer a HEAD as their GET too.
UPSTREAM_METHODS = {"HEAD": "GET"}
# The methods Triton's HTTP API serves; any other is answered 405 here, in Triton's words (fault matrix
# row 67): Triton answers the ones its HTTP parser knows with 405 and drops the connection on the others
# (``M-SEARCH``: a 502 here), so forwarding them could only lose the answer.
SERVED_METHODS = ("GET", "HEAD", "POST")
# Triton's 500s that are about the request's JSON, never the server: answered as the 400 they are.
REQUEST_FAULTS = re.compile(
    r"Unable to parse|attempt to access JSON|attempt to get members|failed to parse the request JSON"
    r"|Expected JSON object|Unable to set 'classification'|failed to get request params"
)


@dataclass(frozen=True)
class FrontLimits:
    max_body_bytes: int = MAX_REQUEST_BYTES  # an inference is bounded by its model's largest request too
    body_timeout_s: float = 30.0
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 75.0  # a kept-alive connection with no request
    upstream_timeout_s: float = 600.0  # a POST that is no inference (a repository load can take minutes)
    shutdown_s: float = 5.0  # on exit, requests still in flight get this long
    # An inference's deadline; POSTs share ``shares.slots.capacity`` upstream connections within each
    # client's share (fault matrix rows 38, 56 and 57); GET/HEAD requests have their own
    # ``quick_connections``, so health and metadata are answered while inference fills the rest.
    shares: FrontShares = field(default_factory=FrontShares)
    quick_connections: int = 32
    quick_timeout_s: float = 60.0
    body_workers: int = DEFAULT_WORKERS  # processes that check large bodies (row 59)
    max_large_bodies: int = DEFAULT_MAX_LARGE  # large bodies read or checked at once


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _answered_as(method: str) -> str:
    """The method whose answer ``method`` gets (``UPSTREAM_METHODS``: a HEAD gets its GET's)."""
    return UPSTREAM_METHODS.get(method, method)


async def _continue(request: web.BaseRequest) -> None:
    """``100 Continue`` to a client that waits for it before it sends its body (``Expect:
    100-continue``, as curl sends a large body), once the request passed every check its headers allow
    (fault matrix row 66): a request refused from its headers is refused before its body is sent.
    Triton sends it at once; aiohttp's low-level server never does, so such a client waited for its
    own timeout (curl's 1 s) on every request, or for good."""
    if request.version >= (1, 1) and request.headers.get("Expect", "").lower() == "100-continue":
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")


def _content_type(request: web.BaseRequest) -> str:
    """The media type alone (``RequestRefusedError`` unless it is one), read without aiohttp's recursive
    header parser: 239 ``(`` overflowed it into a 500 on every route, health included (fault matrix
    row 16)."""
    value = request.headers.get("Content-Type")
    if value is None:
        return ""
    media_type = value.split(";", 1)[0].strip().lower()
    if not MEDIA_TYPE.fullmatch(media_type):
        raise RequestRefusedError(f"Content-Type {value[:40]!r} is not a media type (type/subtype)")
    return media_type


def forwarded_headers(request: web.BaseRequest) -> CIMultiDict[str]:
    """The client's headers to forward; ``RequestRefusedError`` for one sent twice (Triton reads the first
    of two, the front would check the other: one reading for both needs one value).

    Keyed case-insensitively, as HTTP names are: every header the front sets, replaces or drops (a form
    body's ``Content-Type``, ``Content-Encoding``, ``Accept-Encoding``, ``Inference-Header-Content-Length``)
    is then the client's one whatever case it was sent in. Keyed by the names as sent, a name the front
    spelt another way became a second entry, and which of the two reached Triton was left to aiohttp
    (its client keeps the last; its compiled parser gives well-known names their canonical case, its
    pure-Python parser keeps them as sent)."""
    names = Counter(name.decode("latin-1").lower() for name, _ in request.raw_headers)
    twice = sorted(name for name, count in names.items() if count > 1 and name not in HOP_BY_HOP)
    if twice:
        raise RequestRefusedError(f"header {twice[0]!r} is sent {names[twice[0]]} times; send it once")
    return CIMultiDict((k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP)


class FrontConnection(RequestHandler):
    """aiohttp's connection handler plus a deadline for each request's headers, and errors as JSON.

    aiohttp closes a connection that sends nothing for the idle timeout, but a connection that sends
    its headers a byte at a time is kept as long as it trickles. Here the clock starts at the first
    byte a request's head brings while the connection is idle, and stops when the head is complete;
    at ``head_timeout_s`` the client gets a 408 and the connection is closed.

    Malformed HTTP (a bad request line, header or framing) gets a JSON 400 and one log line, not
    aiohttp's text answer and a traceback per request: a client's fault must not fill the log.
    """

    head_timeout_s = 10.0
    _head_timer: asyncio.TimerHandle | None = None

    def data_received(self, data: bytes) -> None:
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
        body = json.dumps({"error": f"request headers not complete within {self.head_timeout_s:g} s"})
        self.transport.write(
            (
                "HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}"
            ).encode()
        )
        self.force_close()

    def connection_lost(self, exc: BaseException | None) -> None:
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
    """aiohttp's low-level server with ``FrontConnection`` connections and a body size bound."""

    def __init__(self, handler, limits: FrontLimits, **kwargs) -> None:
        super().__init__(handler, **kwargs)
        self.limits = limits

    def __call__(self) -> RequestHandler:
        handler = FrontConnection(self, loop=self._loop, **self._kwargs)
        handler.head_timeout_s = self.limits.header_timeout_s
        return handler

    def _make_request(self, message, payload, protocol, writer, task) -> web.BaseRequest:
        return web.BaseRequest(
            message, payload, protocol, writer, task, self._loop, client_max_size=self.limits.max_body_bytes
        )


class HttpFront:
    """The request handler: checks, forwards to ``upstream`` (``host:port``), answers."""

    def __init__(self, upstream: str, limits: FrontLimits, key: str, shm: HttpSharedMemory) -> None:
        self.upstream, self.limits, self.key, self.shm = upstream, limits, key, shm
        self.state = UpstreamState(f"tritonserver at {upstream}", log)
        self.session: ClientSession | None = None
        self.quick: ClientSession | None = None
        self.signatures = ModelSignatures(self._model_config, limits.max_body_bytes)
        self.slots = ClientSlots(limits.shares.slots)
        self.deadlines = Deadlines(self.slots, limits.shares.max_overdue)
        self.checkers = BodyCheckers(limits.body_workers, limits.max_large_bodies)

    async def open(self) -> None:
        self.checkers.start()
        limits = self.limits

        def session(connections: int, timeout_s: float) -> ClientSession:
            return ClientSession(
                f"http://{self.upstream}",
                connector=TCPConnector(limit=connections),
                timeout=ClientTimeout(total=timeout_s),
                auto_decompress=False,
            )

        # room for the slots' requests and for the overdue ones still running beside them
        self.session = session(limits.shares.slots.capacity * 2, limits.upstream_timeout_s)
        self.quick = session(limits.quick_connections, limits.quick_timeout_s)

    async def close(self) -> None:
        for session in (self.session, self.quick):
            if session is not None:
                await session.close()
        self.checkers.close()

    async def _model_config(self, model: str, version: str) -> dict:
        """The config Triton serves for ``model`` (raw, as named in the path), or Triton's refusal."""
        assert self.quick is not None
        versioned = f"/versions/{version}" if version else ""
        url = URL(f"/v2/models/{model}{versioned}/config", encoded=True)
        try:
            async with self.quick.get(url, headers={"Accept-Encoding": "identity"}) as answer:
                document = await answer.json(content_type=None)
                status = answer.status
        except (ClientError, asyncio.TimeoutError) as error:
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
        info = request.transport.get_extra_info
        peer, local = info("peername"), info("sockname")
        uid = peer_uid(peer[:2], local[:2]) if peer and local else None
        admin = bool(self.key) and request.headers.get(ADMIN_HEADER) == self.key
        return Client(uid, admin)

    async def _check(
        self, request: web.BaseRequest, path: str, body: bytes, model: ModelSignature | None
    ) -> list[RegionUse]:
        """The checks of the route ``path`` (Triton's raw path: it does not decode names); ``model``
        is the config of the model an inference names. What reads the body is a pure function, run in
        a worker for a large body (``BodyCheckers``). Returns the shared-memory ranges an inference
        request names (the front copies them once they passed: ``HttpSharedMemory.to_triton``)."""
        if request.method != "POST":
            return []
        check = functools.partial(self.checkers.check, len(body))
        if model is not None and path.endswith(("/generate", "/generate_stream")):
            await check(check_generate, body, model)
        elif model is not None:
            header_length = request.headers.get("Inference-Header-Content-Length")
            return await check(check_infer, body, header_length, model)
        elif body:
            await check(check_json, body)  # every other /v2 POST body is JSON: one reading for both
        return []

    def _body_limit(self, path: str, model: ModelSignature | None) -> tuple[int, str]:
        """How large a body the route ``path`` takes, and why: an inference, its model's largest valid
        request; a shared-memory call, what the event loop parses inline (it is read there: a
        registration is a few fields); any other, the front's own bound."""
        if model is not None:
            return model.largest_request_bytes(), f"the largest request model '{model.model}' takes"
        if SYSTEM_SHM.fullmatch(path):
            return INLINE_BYTES, "the largest a shared-memory call takes"
        return self.limits.max_body_bytes, "the largest the front takes"

    async def _model(self, request: web.BaseRequest, path: str) -> ModelSignature | None:
        """The config of the model an inference names (``RequestRefusedError`` when Triton has none:
        never forwarded unchecked); None for other routes."""
        match = INFER.fullmatch(path) if request.method == "POST" else None
        return await self.signatures.get(match[1], match[2] or "") if match else None

    async def _read_body(
        self, request: web.BaseRequest, limit: int, what: str, need: Callable[[int | None], None]
    ) -> bytes:
        """The whole body, counted as it arrives: 413 (``TOO_LARGE``) past ``limit`` (a chunked body
        has no ``Content-Length`` to check first), a large-body place taken as soon as it is large."""
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
            model = await self._model(request, path)
            limit, what = self._body_limit(path, model)
            declared = request.content_length
            if declared is not None and declared > limit:  # before reading a byte
                raise RequestRefusedError(
                    f"request body of {declared} bytes exceeds {limit}, {what}", Refusal.TOO_LARGE
                )
            with self.checkers.place() as need:
                need(declared)
                await _continue(request)
                reading = self._read_body(request, limit, what, need)
                body = await asyncio.wait_for(reading, self.limits.body_timeout_s)
                body_read = True
                body = inflate(body, headers.pop("Content-Encoding", None), limit)
                need(len(body))
                answer = self.shm.answer(
                    _answered_as(request.method), path, body, lambda: self._client(request)
                )
                if answer is not None:  # the shared-memory API, served by the front itself
                    return answer
                client, outputs = None, None
                if await self._check(request, path, body, model):
                    assert model is not None  # only an inference names regions
                    client = self._client(request)
                    body, outputs = self.shm.to_triton(client, body, headers, model)  # Triton never maps it
        except asyncio.TimeoutError:
            response = _error(408, f"request body not complete within {self.limits.body_timeout_s:g} s")
            response.force_close()
            return response
        except RequestRefusedError as refusal:
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
            return _error(refusal.kind.http_status, str(refusal))
        return answer

    async def _forward(
        self,
        request: web.BaseRequest,
        target: str,
        headers: CIMultiDict[str],
        body: bytes,
        model: ModelSignature | None,
    ) -> web.Response:
        """Send the checked ``target`` upstream; GET/HEAD on their own connections, other methods on
        the shared ones within the client's share (``ClientSlots``), an inference within its model's
        deadline (``Deadlines.within``). A client that hangs up cancels this (the server's
        ``handler_cancellation``), which closes its upstream connection."""
        if request.method in QUICK_METHODS:
            assert self.quick is not None
            return await self._exchange(self.quick, request, target, headers, body)
        assert self.session is not None
        peer = request.transport.get_extra_info("peername") if request.transport else None
        address = request.remote or ""
        connection = f"{peer[0]}:{peer[1]}" if peer else address
        exchange = functools.partial(self._exchange, self.session, request, target, headers, body)
        if model is None:
            async with self.slots.held(address, connection):
                return await exchange()
        deadline = model.deadline_s or self.limits.shares.deadline_s
        return await self.deadlines.within(address, connection, model.model, deadline, exchange)

    async def _exchange(
        self,
        session: ClientSession,
        request: web.BaseRequest,
        target: str,
        headers: CIMultiDict[str],
        body: bytes,
    ) -> web.Response:
        url = URL(target, encoded=True)
        try:
            async with session.request(
                _answered_as(request.method), url, data=body, headers=headers, allow_redirects=False
            ) as answer:
                payload = await answer.read()
                status = answer.status
                kept = CIMultiDict((k, v) for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP)
        except ClientConnectorError as error:
            self.state.down(error)
            return _error(503, f"tritonserver is not reachable (starting, restarting or down): {error}")
        except (ClientError, asyncio.TimeoutError) as error:
            self.state.down(error)
            return _error(502, f"tritonserver did not answer the request (it may have crashed): {error!r}")
        self.state.up()
        if status == 500 and REQUEST_FAULTS.search(payload.decode(errors="replace")):
            status = 400
        return web.Response(status=status, body=payload, headers=kept)


async def start_front(listen: str, front: HttpFront) -> Callable[[], Awaitable[None]]:
    """Listen on ``listen`` (``host:port``); returns the coroutine function that stops the front."""
    host, port = listen.rsplit(":", 1)
    await front.open()
    limits = front.limits
    server = FrontServer(
        front.handle,
        limits,
        handler_cancellation=True,  # a client that hangs up frees its upstream connection (row 38)
        keepalive_timeout=limits.idle_timeout_s,
        auto_decompress=False,
        access_log=None,
    )
    runner = web.ServerRunner(server, shutdown_timeout=limits.shutdown_s)
    await runner.setup()
    await web.TCPSite(runner, host, int(port)).start()
    log.info("http front on %s -> %s", listen, front.upstream)

    async def stop() -> None:
        # Stops listening, lets requests in flight finish (shutdown_s at most), then closes the upstream
        # connections (kept-alive ones would otherwise hold tritonserver's exit for its exit timeout).
        await runner.cleanup()
        await front.close()

    return stop


def main(argv: list[str] | None = None) -> None:
    parser = front_parser(
        "python -m server.fronts.http_front", __doc__, "host:port of tritonserver's HTTP endpoint"
    )
    parser.add_argument("--max-body-mib", type=int, default=FrontLimits.max_body_bytes // MIB)
    parser.add_argument("--body-timeout-s", type=float, default=FrontLimits.body_timeout_s)
    parser.add_argument("--header-timeout-s", type=float, default=FrontLimits.header_timeout_s)
    parser.add_argument(
        "--body-workers",
        type=int,
        default=FrontLimits.body_workers,
        help="processes that check request bodies above 256 KiB off the event loop",
    )
    parser.add_argument(
        "--max-large-bodies",
        type=int,
        default=FrontLimits.max_large_bodies,
        help="large bodies read or checked at once (429 beyond: send binary tensor data)",
    )
    add_share_arguments(parser)
    args = parser.parse_args(argv)
    limits = FrontLimits(
        max_body_bytes=args.max_body_mib * MIB,
        body_timeout_s=args.body_timeout_s,
        header_timeout_s=args.header_timeout_s,
        shares=shares_from_args(args),
        body_workers=args.body_workers,
        max_large_bodies=args.max_large_bodies,
    )
    shm = HttpSharedMemory(server_regions(args), limits.max_body_bytes, args.trusted_shared_memory)
    front = HttpFront(args.upstream, limits, admin_key(), shm)
    run_front(lambda: start_front(args.listen, front), args)


if __name__ == "__main__":
    main()
