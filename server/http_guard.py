"""An HTTP front for tritonserver 2.51: bounds and checks each request before Triton's own HTTP
frontend sees it, because that frontend crashes the whole server on a few small inputs (issue #11,
rows 5 and 6; gRPC answers the same inputs with INVALID_ARGUMENT):

* a form-encoded body of a few MB (``curl -d``) is parsed as a query string by libevhtp and
  segfaults the server: the guard forwards such bodies as ``application/json``, which is what they
  are on every ``/v2`` route;
* a declared shape like ``[64, 2^40]`` in a 300-byte body, or 200k nested ``[``, kills it while it
  allocates or parses: the guard parses the JSON header itself (Python's parser refuses deep nesting
  with an error) and refuses an input that declares more elements than bytes carry it;
* a body above ``max_body_bytes`` is refused with 413 before it is buffered (aiohttp's limit);
* pipelined requests and a ``Content-Length`` larger than the body: aiohttp parses the framing, the
  guard buffers each whole body (408 after ``body_timeout_s``) and forwards complete requests only;
* a number inside JSON ``BYTES`` data: Triton answers 500 without naming the input; the guard answers
  400 naming it.

It is what production puts in front of an HTTP service (a reverse proxy that bounds body size,
rejects malformed framing and buffers bodies), written on aiohttp (already a tritonclient
dependency) because the shape check needs to read the KServe JSON header. Triton's own HTTP port
then listens on a loopback port of its own. Errors use Triton's shape, ``{"error": "..."}``, so
tritonclient reports them like Triton's. Costs: one extra loopback hop and a JSON parse per HTTP
inference request; gRPC does not pass through it.

Run as ``python -m server.http_guard --listen HOST:PORT --upstream HOST:PORT [--server-pid PID]``;
with ``--server-pid`` it exits when that tritonserver does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import signal
from dataclasses import dataclass

from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

log = logging.getLogger(__name__)
MIB = 1 << 20
HOP_BY_HOP = {
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "transfer-encoding", "upgrade", "host", "content-length",
}  # fmt: skip
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


@dataclass(frozen=True)
class GuardLimits:
    max_body_bytes: int = 64 * MIB  # a batch-32 image request as JSON is about 8 MB
    body_timeout_s: float = 30.0
    upstream_timeout_s: float = 600.0


class BadRequestError(ValueError):
    """The request would reach a Triton 2.51 crash path; the message says what is wrong with it."""


def _json_header(body: bytes, header_length: str | None) -> object:
    """The KServe JSON header: the whole body, or its first ``Inference-Header-Content-Length`` bytes."""
    if header_length is not None:
        if not header_length.isdigit() or int(header_length) > len(body):
            raise BadRequestError(f"Inference-Header-Content-Length {header_length!r} does not fit the body")
        body = body[: int(header_length)]
    try:
        return json.loads(body)
    except RecursionError as error:
        raise BadRequestError("request JSON nests too deeply") from error
    except ValueError as error:
        raise BadRequestError(f"request body is not valid JSON: {error}") from error


def check_infer_body(body: bytes, header_length: str | None) -> None:
    """``BadRequestError`` unless every input's declared shape is plausible for the bytes that carry it.

    Every element takes at least one byte of the body (JSON text or binary data), or of the shared
    memory region the input names; an input declaring more is refused before Triton allocates for it.
    """
    document = _json_header(body, header_length)
    inputs = document.get("inputs") if isinstance(document, dict) else None
    if not isinstance(inputs, list):
        raise BadRequestError("request JSON must be an object with an 'inputs' list")
    for item in inputs:
        if not isinstance(item, dict):
            raise BadRequestError("each entry of 'inputs' must be an object")
        name, shape = item.get("name"), item.get("shape")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise BadRequestError(
                f"input {name!r}: shape must be a list of non-negative integers, got {shape!r}"
            )
        parameters = item.get("parameters") if isinstance(item.get("parameters"), dict) else {}
        carrier = len(body)
        if "shared_memory_region" in parameters:
            size = parameters.get("shared_memory_byte_size", 0)
            carrier = size if isinstance(size, int) and size >= 0 else 0
        elements = math.prod(shape)
        if elements > carrier:
            raise BadRequestError(
                f"input {name!r} declares shape {shape} ({elements} elements) but the request carries "
                f"only {carrier} bytes for it"
            )
        if item.get("datatype") == "BYTES" and "data" in item:
            _check_strings(name, item["data"])


def _check_strings(name: object, data: object) -> None:
    """JSON ``BYTES`` data must be strings: Triton 2.51 answers anything else with a 500 that does not
    name the input ("attempt to access JSON non-string as string")."""
    pending = [data]
    while pending:  # iterative: the JSON parser has already bounded the nesting
        value = pending.pop()
        if isinstance(value, list):
            pending.extend(value)
        elif not isinstance(value, str):
            raise BadRequestError(
                f"input {name!r}: BYTES data must be JSON strings, got {json.dumps(value)[:40]}"
            )


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def make_app(upstream: str, limits: GuardLimits = GuardLimits()) -> web.Application:
    """The guard as an aiohttp application forwarding to ``upstream`` (``host:port``)."""

    async def start(app: web.Application) -> None:
        app["session"] = ClientSession(
            f"http://{upstream}",
            connector=TCPConnector(limit=256),
            timeout=ClientTimeout(total=limits.upstream_timeout_s),
            auto_decompress=False,
        )

    async def close(app: web.Application) -> None:
        await app["session"].close()

    async def forward(request: web.Request) -> web.Response:
        declared = request.content_length
        if declared is not None and declared > limits.max_body_bytes:  # refuse before reading a byte
            response = _error(413, f"request body of {declared} bytes exceeds {limits.max_body_bytes}")
            response.force_close()
            return response
        try:
            body = await asyncio.wait_for(request.read(), limits.body_timeout_s)
        except asyncio.TimeoutError:
            return _error(408, f"request body not complete within {limits.body_timeout_s:.0f} s")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        headers.setdefault("Accept-Encoding", "identity")  # aiohttp would ask for gzip on its own
        if request.content_type in FORM_TYPES:
            headers["Content-Type"] = "application/json"  # libevhtp would parse it as a query string
        if request.method == "POST" and request.path.endswith("/infer"):
            try:
                check_infer_body(body, request.headers.get("Inference-Header-Content-Length"))
            except BadRequestError as error:
                return _error(400, str(error))
        session: ClientSession = request.app["session"]
        async with session.request(
            request.method, request.rel_url, data=body, headers=headers, allow_redirects=False
        ) as answer:
            payload = await answer.read()
            kept = {k: v for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP}
            return web.Response(status=answer.status, body=payload, headers=kept)

    app = web.Application(client_max_size=limits.max_body_bytes)
    app.on_startup.append(start)
    app.on_cleanup.append(close)
    app.router.add_route("*", "/{path:.*}", forward)
    return app


async def _watch(pid: int | None, stop: asyncio.Event) -> None:
    """Return on SIGTERM, or once process ``pid`` is gone (the guard lives as long as its server)."""
    while not stop.is_set():
        if pid is None:
            await stop.wait()
            return
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        except PermissionError:
            pass
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


async def serve(listen: str, upstream: str, limits: GuardLimits, server_pid: int | None) -> None:
    host, port = listen.rsplit(":", 1)
    runner = web.AppRunner(make_app(upstream, limits), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, int(port)).start()
    log.info("http guard on %s -> %s", listen, upstream)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        await _watch(server_pid, stop)
    finally:
        # Stops listening, lets requests in flight finish, then closes the upstream connections
        # (kept-alive ones would otherwise hold tritonserver's shutdown for its whole exit timeout).
        await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m server.http_guard", description=__doc__)
    parser.add_argument("--listen", required=True, help="host:port clients connect to")
    parser.add_argument("--upstream", required=True, help="host:port of tritonserver's HTTP endpoint")
    parser.add_argument("--server-pid", type=int, help="exit when this process exits")
    parser.add_argument("--max-body-mib", type=int, default=GuardLimits.max_body_bytes // MIB)
    parser.add_argument("--body-timeout-s", type=float, default=GuardLimits.body_timeout_s)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    limits = GuardLimits(max_body_bytes=args.max_body_mib * MIB, body_timeout_s=args.body_timeout_s)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.listen, args.upstream, limits, args.server_pid))


if __name__ == "__main__":
    main()
