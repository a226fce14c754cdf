"""The soak's one HTTP/1.1 client, on a raw socket, so a request goes out as its caller built it. An answer
is a status line, its headers and its whole body (a HEAD's ends at its headers) within ``timeout_s``,
decoded as a client would; anything else is no answer, and ``failure`` says which. A front answers even
a request it will not read before it closes, so a dropped request is the front's fault."""

from __future__ import annotations

import contextlib
import re
import selectors
import socket
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from threading import Event

from server.fronts.body_checks import WBITS

TIMEOUT_S = 30.0  # a hang guard, not a latency bound: unanswered by then counts as never
STATUS_LINE = re.compile(rb"HTTP/1\.[01] (\d{3})(?: .*)?")
CONTENT_LENGTH = re.compile(rb"(?im)^content-length:[ \t]*(\d+)[ \t]*\r?$")
CONTENT_ENCODING = re.compile(rb"(?im)^content-encoding:[ \t]*([^\r\n]*?)[ \t]*\r?$")
MAX_DECODED_BYTES = 1 << 30  # a guard against a runaway answer, far above any the fuzz asks for


@dataclass
class Request:
    """One request as sent; ``Host``, ``Connection: close`` and the framing are added on the wire."""

    method: str
    path: str
    headers: list[tuple[str, str]]
    body: bytes = b""
    name_case: Callable[[str], str] = field(default=str, repr=False)

    def raw(self) -> bytes:
        case = self.name_case
        lines = [f"{self.method} {self.path} HTTP/1.1", f"{case('Host')}: soak"]
        lines += [f"{case('Connection')}: close"]
        lines += [f"{name}: {value}" for name, value in self.headers]
        chunked = any(n.lower() == "transfer-encoding" for n, _ in self.headers)
        lines += [] if chunked else [f"{case('Content-Length')}: {len(self.body)}"]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape")
        if not chunked:
            return head + self.body
        half = len(self.body) // 2
        chunks = [part for part in (self.body[:half], self.body[half:]) if part]
        return head + b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"


@dataclass(frozen=True)
class HttpReply:
    """An answer, or the ``failure`` that says why none came."""

    status: int = 0
    body: bytes = b""
    elapsed_s: float = 0.0
    failure: str = ""
    encoding: str = ""


def address(url: str) -> tuple[str, int]:
    """A ``host:port`` URL as a socket address."""
    host, port = url.rsplit(":", 1)
    return host, int(port)


def exchange(address: tuple[str, int], request: Request, timeout_s: float = TIMEOUT_S) -> HttpReply:
    """``request`` on a connection of its own, and what came back by the module's rule."""
    return pipelined(address, request.raw(), 1, timeout_s, head_only=request.method == "HEAD")[0]


def pipelined(
    address: tuple[str, int],
    raw: bytes,
    replies: int,
    timeout_s: float,
    sent: Event | None = None,
    head_only: bool = False,
) -> list[HttpReply]:
    """``raw`` on one connection, and the first ``replies`` that came back, up to the first no answer."""
    start, received, got = time.monotonic(), b"", []
    try:
        with socket.create_connection(address, timeout=timeout_s) as sock:
            # the front may answer (413) and close before it read the whole body: read that answer
            with contextlib.suppress(OSError):
                sock.sendall(raw)
                if sent is not None:
                    sent.set()
            while True:
                remaining = timeout_s - (time.monotonic() - start)
                if remaining <= 0:
                    raise TimeoutError
                sock.settimeout(remaining)
                chunk = sock.recv(1 << 20)
                received += chunk
                elapsed_s = time.monotonic() - start
                while (split := reply_in(received, not chunk, elapsed_s, head_only))[0] is not None:
                    reply, received = split
                    got.append(reply)
                    if reply.failure or len(got) == replies:
                        return got
    except TimeoutError:
        return [*got, HttpReply(elapsed_s=time.monotonic() - start, failure="hang")]
    except OSError as error:
        return [*got, HttpReply(elapsed_s=time.monotonic() - start, failure=f"closed: {error!r}")]


def hang_ups(
    address: tuple[str, int], raw: bytes, count: int, after_s: float, source: str = ""
) -> list[HttpReply]:
    """``raw`` on ``count`` connections of its own at once (from the local address ``source``, if given),
    each closed ``after_s`` after the last was sent unless it was answered before: the answers that came
    by then (a connection that ended without one: its ``failure``)."""
    bind = (source, 0) if source else None
    got: list[HttpReply] = []
    with selectors.DefaultSelector() as waiting, contextlib.ExitStack() as connections:
        for _ in range(count):
            try:
                sock = connections.enter_context(
                    socket.create_connection(address, timeout=TIMEOUT_S, source_address=bind)
                )
            except OSError as error:
                got.append(HttpReply(failure=f"closed: {error!r}"))
                continue
            with contextlib.suppress(OSError):  # answered and closed before it read it all: read that
                sock.sendall(raw)
            waiting.register(sock, selectors.EVENT_READ, data=bytearray())
        hang_up_at = time.monotonic() + after_s
        while waiting.get_map() and (left := hang_up_at - time.monotonic()) > 0:
            for key, _ in waiting.select(left):
                try:
                    chunk = key.fileobj.recv(1 << 20)
                except OSError:
                    chunk = b""
                key.data.extend(chunk)
                reply = reply_in(bytes(key.data), not chunk)[0]
                if reply is not None:
                    got.append(reply)
                    waiting.unregister(key.fileobj)
    return got


def reply_in(
    received: bytes, ended: bool, elapsed_s: float = 0.0, head_only: bool = False
) -> tuple[HttpReply | None, bytes]:
    """The first reply in ``received`` (None while more may come) and the bytes after it."""
    head, found, body = received.partition(b"\r\n\r\n")
    if not found:
        return (HttpReply(elapsed_s=elapsed_s, failure="closed: no status line") if ended else None), received
    status = STATUS_LINE.fullmatch(head.split(b"\r\n", 1)[0])
    if status is None:
        return HttpReply(elapsed_s=elapsed_s, failure=f"not HTTP: {head[:80]!r}"), b""
    if head_only:
        return HttpReply(int(status[1]), b"", elapsed_s, encoding=_encoding(head)), body
    declared = CONTENT_LENGTH.search(head)
    length = int(declared[1]) if declared else None
    if length is not None and len(body) >= length:
        return _decoded(int(status[1]), head, body[:length], elapsed_s), body[length:]
    if not ended:
        return None, received
    if length is None:  # no Content-Length: the body ran to the connection's end
        return _decoded(int(status[1]), head, body, elapsed_s), b""
    return HttpReply(elapsed_s=elapsed_s, failure=f"closed: {len(body)} of its {length} body bytes"), b""


def _decoded(status: int, head: bytes, body: bytes, elapsed_s: float) -> HttpReply:
    encoding = _encoding(head)
    if encoding not in WBITS or not body:  # an empty body (a 204) decodes to itself
        return HttpReply(status, body, elapsed_s, encoding=encoding)
    decoder = zlib.decompressobj(WBITS[encoding])
    try:
        plain = decoder.decompress(body, MAX_DECODED_BYTES)
    except zlib.error as error:
        return HttpReply(elapsed_s=elapsed_s, failure=f"undecodable: a {status} in {encoding}: {error}")
    if not decoder.eof or decoder.unused_data or decoder.unconsumed_tail:
        whole = f"undecodable: a {status} not one whole {encoding} stream"
        return HttpReply(elapsed_s=elapsed_s, failure=whole)
    return HttpReply(status, plain, elapsed_s, encoding=encoding)


def _encoding(head: bytes) -> str:
    named = CONTENT_ENCODING.search(head)
    return named[1].decode("latin-1").lower() if named else ""
