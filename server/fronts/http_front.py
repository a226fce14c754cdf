"""An HTTP front for tritonserver 2.51: bounds and checks each request before Triton's own HTTP
frontend sees it, because that frontend crashes the whole server on a few small inputs (the
fault matrix's HTTP-front rows, docs/SERVING.md) and blames the server (500) for many faulty ones:

* the request target: only a plain origin-form ``/v2/...`` path, and Triton gets the path that was
  checked, never the raw target (``server.fronts.request_target``; fault matrix row 35);
* upstream connections: one client address may have ``max_client_requests`` requests waiting on
  Triton (429 beyond), GET/HEAD have connections of their own, and a client that hangs up cancels
  its upstream request (row 38);
* framing: a body above ``max_body_bytes`` is refused with 413 before it is buffered; each whole body
  is buffered (408 after ``body_timeout_s``) and a request's headers must be complete within
  ``header_timeout_s`` of their first byte (408; slowloris); pipelined requests are answered in order;
* one reading: a header Triton reads (``Inference-Header-Content-Length``, ``Content-Type``, ...)
  sent twice, a JSON key sent twice, or a number only one parser can hold is a 400, so the front and
  Triton can never check and run two different requests (``server.fronts.kserve_json``);
* ``Content-Encoding: gzip|deflate`` bodies are inflated here, bounded by ``max_body_bytes``, and
  forwarded plain (415 for other encodings, 400 for a body that does not inflate);
* a form-encoded body (``curl -d``) is forwarded as ``application/json``, which it is on every ``/v2``
  route (libevhtp would parse it as a query string and segfault);
* inference JSON is checked field by field (400 naming the field where Triton says 500), and no input
  may declare more elements than bytes carry it, nor a shape its model's config does not allow
  (``server.fronts.tensor_limits``, ``server.fronts.model_shapes``; row 37);
* system shared memory is served here, from the front's own table: Triton never maps a client's file
  (``server.fronts.shm_http``, ``server.fronts.client_regions``; fault matrix rows 24, 43–45, 49–52);
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
import json
import logging
import re
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import ClientConnectorError, ClientError, ClientSession, ClientTimeout, TCPConnector, web
from aiohttp.web_protocol import RequestHandler
from yarl import URL

from server.admin import ADMIN_HEADER, FRONT_HEADER
from server.fronts.body_encoding import inflate
from server.fronts.client_regions import Client, RegionUse
from server.fronts.kserve_json import check_generate, check_infer, load_json
from server.fronts.model_shapes import ModelShapesCache
from server.fronts.peer import peer_uid
from server.fronts.process import MIB, admin_key, front_parser, run_front, server_regions
from server.fronts.refusal import RequestRefusedError
from server.fronts.request_target import checked_target, forwarded_target
from server.fronts.shm_http import HttpSharedMemory
from server.fronts.tensor_limits import ModelShapes
from server.fronts.upstream_state import UpstreamState

log = logging.getLogger(__name__)
HOP_BY_HOP = {
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "transfer-encoding", "upgrade", "host", "content-length", FRONT_HEADER,
}  # fmt: skip
TOKEN = r"[!#$%&'*+.^_`|~0-9a-z-]+"
MEDIA_TYPE = re.compile(f"{TOKEN}/{TOKEN}")
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")
INFER = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?/infer")
REPOSITORY_CHANGE = re.compile(r"/v2/repository/models/([^/]+)/(?:load|unload)")
QUICK_METHODS = ("GET", "HEAD")  # health, metadata, config, statistics: their own upstream connections
# Triton's 500s that are about the request's JSON, never the server: answered as the 400 they are.
REQUEST_FAULTS = re.compile(
    r"Unable to parse|attempt to access JSON|attempt to get members|failed to parse the request JSON"
    r"|Expected JSON object|Unable to set 'classification'|failed to get request params"
)


@dataclass(frozen=True)
class FrontLimits:
    max_body_bytes: int = 64 * MIB  # a batch-32 image request as JSON is about 8 MB
    body_timeout_s: float = 30.0
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 75.0  # a kept-alive connection with no request
    upstream_timeout_s: float = 600.0
    shutdown_s: float = 5.0  # on exit, requests still in flight get this long
    # Upstream connections (fault matrix row 38): POSTs share ``upstream_connections``, of which one
    # client (peer address) may hold ``max_client_requests``; GET/HEAD requests have their own
    # ``quick_connections``, so health and metadata are answered while inference fills the rest.
    upstream_connections: int = 256
    max_client_requests: int = 64
    quick_connections: int = 32
    quick_timeout_s: float = 60.0


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


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


def _forwarded_headers(request: web.BaseRequest) -> dict[str, str]:
    """The client's headers to forward; ``RequestRefusedError`` for one sent twice (Triton reads the first
    of two, a dict keeps the last: one reading for both needs one value)."""
    names = Counter(name.decode("latin-1").lower() for name, _ in request.raw_headers)
    twice = sorted(name for name, count in names.items() if count > 1 and name not in HOP_BY_HOP)
    if twice:
        raise RequestRefusedError(f"header {twice[0]!r} is sent {names[twice[0]]} times; send it once")
    return {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}


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
        self.shapes = ModelShapesCache(self._model_config)
        self.in_flight: Counter[str] = Counter()  # POSTs upstream, by client address

    async def open(self) -> None:
        self.session = ClientSession(
            f"http://{self.upstream}",
            connector=TCPConnector(limit=self.limits.upstream_connections),
            timeout=ClientTimeout(total=self.limits.upstream_timeout_s),
            auto_decompress=False,
        )
        self.quick = ClientSession(
            f"http://{self.upstream}",
            connector=TCPConnector(limit=self.limits.quick_connections),
            timeout=ClientTimeout(total=self.limits.quick_timeout_s),
            auto_decompress=False,
        )

    async def close(self) -> None:
        for session in (self.session, self.quick):
            if session is not None:
                await session.close()

    async def _model_config(self, model: str, version: str) -> dict | None:
        """The config Triton serves for ``model`` (raw, as named in the path), or None."""
        assert self.quick is not None
        versioned = f"/versions/{version}" if version else ""
        url = URL(f"/v2/models/{model}{versioned}/config", encoded=True)
        async with self.quick.get(url, headers={"Accept-Encoding": "identity"}) as answer:
            document = await answer.json(content_type=None) if answer.status == 200 else None
        return document if isinstance(document, dict) else None

    async def _model_shapes(self, request: web.BaseRequest, path: str) -> ModelShapes | None:
        match = INFER.fullmatch(path) if request.method == "POST" else None
        return await self.shapes.get(match[1], match[2] or "") if match else None

    def _client(self, request: web.BaseRequest) -> Client:
        peer, local = (
            request.transport.get_extra_info("peername"),
            request.transport.get_extra_info("sockname"),
        )
        uid = peer_uid(peer[:2], local[:2]) if peer and local else None
        admin = bool(self.key) and request.headers.get(ADMIN_HEADER) == self.key
        return Client(uid, admin)

    def _check(
        self, request: web.BaseRequest, path: str, body: bytes, model: ModelShapes | None
    ) -> list[RegionUse]:
        """The checks of the route ``path`` (Triton's raw path: it does not decode names); ``model``
        is what the config of the model it names allows. Returns the shared-memory ranges an
        inference request names."""
        if request.method != "POST":
            return []
        if path.endswith("/infer"):
            return check_infer(body, request.headers.get("Inference-Header-Content-Length"), model)
        if path.endswith(("/generate", "/generate_stream")):
            check_generate(body)
        elif body:
            load_json(body)  # every other /v2 POST body is JSON: one reading for both (duplicate keys)
        return []

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        declared = request.content_length
        if declared is not None and declared > self.limits.max_body_bytes:  # before reading a byte
            response = _error(413, f"request body of {declared} bytes exceeds {self.limits.max_body_bytes}")
            response.force_close()
            return response
        try:
            path, query = checked_target(request.raw_path)  # fault matrix row 35
            headers = _forwarded_headers(request)
            form = _content_type(request) in FORM_TYPES
            body = await asyncio.wait_for(request.read(), self.limits.body_timeout_s)
            encoding = next((headers.pop(k) for k in list(headers) if k.lower() == "content-encoding"), None)
            body = inflate(body, encoding, self.limits.max_body_bytes)
            answer = self.shm.answer(request.method, path, body, lambda: self._client(request))
            if answer is not None:  # the shared-memory API, served by the front itself
                return answer
            client, outputs = None, None
            if self._check(request, path, body, await self._model_shapes(request, path)):
                client = self._client(request)
                body, outputs = self.shm.to_triton(client, body, headers)  # Triton never maps it
        except asyncio.TimeoutError:
            response = _error(408, f"request body not complete within {self.limits.body_timeout_s:g} s")
            response.force_close()
            return response
        except web.HTTPRequestEntityTooLarge:
            response = _error(413, f"request body exceeds {self.limits.max_body_bytes} bytes")
            response.force_close()
            return response
        except RequestRefusedError as refusal:
            return _error(refusal.kind.http_status, str(refusal))
        headers.setdefault("Accept-Encoding", "identity")  # aiohttp would ask for gzip on its own
        if form:
            headers["Content-Type"] = "application/json"  # libevhtp would parse it as a query string
        if self.key:
            headers[FRONT_HEADER] = self.key  # Triton's own port answers inference/shm only with it
        answer = await self._forward(request, forwarded_target(path, query), headers, body)
        if match := REPOSITORY_CHANGE.fullmatch(path):
            self.shapes.forget(match[1])
        if outputs and client is not None:
            try:
                return self.shm.to_client(client, outputs, answer)
            except RequestRefusedError as refusal:
                return _error(refusal.kind.http_status, str(refusal))
        return answer

    async def _forward(
        self, request: web.BaseRequest, target: str, headers: dict[str, str], body: bytes
    ) -> web.Response:
        """Send the checked ``target`` upstream; GET/HEAD on their own connections, other methods on
        the shared ones within the client's share (429 beyond it). A client that hangs up cancels
        this (the server's ``handler_cancellation``), which closes its upstream connection."""
        if request.method in QUICK_METHODS:
            assert self.quick is not None
            return await self._exchange(self.quick, request, target, headers, body)
        assert self.session is not None
        client = request.remote or ""
        if self.in_flight[client] >= self.limits.max_client_requests:
            return _error(
                429,
                f"this client ({client}) already has {self.in_flight[client]} requests waiting on "
                f"tritonserver, its share of {self.limits.upstream_connections}; send more when those "
                "are answered",
            )
        self.in_flight[client] += 1
        try:
            return await self._exchange(self.session, request, target, headers, body)
        finally:
            self.in_flight[client] -= 1
            if not self.in_flight[client]:
                del self.in_flight[client]

    async def _exchange(
        self,
        session: ClientSession,
        request: web.BaseRequest,
        target: str,
        headers: dict[str, str],
        body: bytes,
    ) -> web.Response:
        url = URL(target, encoded=True)
        try:
            async with session.request(
                request.method, url, data=body, headers=headers, allow_redirects=False
            ) as answer:
                payload = await answer.read()
                status = answer.status
                kept = {k: v for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP}
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
        "--max-client-requests",
        type=int,
        default=FrontLimits.max_client_requests,
        help="requests one client address may have waiting on tritonserver (429 beyond)",
    )
    args = parser.parse_args(argv)
    limits = FrontLimits(
        max_body_bytes=args.max_body_mib * MIB,
        body_timeout_s=args.body_timeout_s,
        header_timeout_s=args.header_timeout_s,
        max_client_requests=args.max_client_requests,
    )
    shm = HttpSharedMemory(server_regions(args), args.trusted_shared_memory, limits.max_body_bytes)
    front = HttpFront(args.upstream, limits, admin_key(), shm)
    run_front(lambda: start_front(args.listen, front), args)


if __name__ == "__main__":
    main()
