"""The soak's one rule for what an HTTP exchange got back (``soak.raw_http``), on the bytes a connection
delivered: an answer only when its status line and whole body came; a connection that ended first, or
a first line that is no status line, is no answer for every caller alike."""

from __future__ import annotations

import pytest

from soak.raw_http import HttpReply, Request, reply_in

ANSWER = b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: 13\r\n\r\n"
LOWER = ANSWER.replace(b"Content-Length", b"content-LENGTH")
ERROR = b'{"error":"x"}'


@pytest.mark.parametrize(
    ("received", "ended", "reply"),
    [
        (ANSWER + ERROR + b"more", False, HttpReply(400, ERROR)),
        (LOWER + ERROR, False, HttpReply(400, ERROR)),
        (b"HTTP/1.1 200 OK\r\n\r\n{}", True, HttpReply(200, b"{}")),  # no length: the body runs to the end
        (b"", True, HttpReply(failure="closed: no status line")),
        (b"HTTP/1.1 200 OK\r\nContent-", True, HttpReply(failure="closed: no status line")),
        (ANSWER + b'{"err', True, HttpReply(failure="closed: 5 of its 13 body bytes")),
        (b"\x00\x00\x12\x04\x00\r\n\r\n", False, HttpReply(failure="not HTTP: b'\\x00\\x00\\x12\\x04\\x00'")),
        (b"HTTP/1.1 2OO OK\r\n\r\n", True, HttpReply(failure="not HTTP: b'HTTP/1.1 2OO OK'")),
    ],
)
def test_a_reply_is_an_answer_only_when_whole(received: bytes, ended: bool, reply: HttpReply) -> None:
    assert reply_in(received, ended) == reply


@pytest.mark.parametrize(
    "received", [b"", b"HTTP/1.1 200 OK\r\n", ANSWER + b"{", b"HTTP/1.1 200 OK\r\n\r\n{}"]
)
def test_more_is_awaited_while_the_connection_lasts(received: bytes) -> None:
    assert reply_in(received, ended=False) is None


def test_a_request_asks_to_close_and_is_framed_by_its_headers() -> None:
    plain = Request("POST", "/v2", [("X", "1"), ("X", "2")], b"abcd").raw()
    chunked = Request("POST", "/v2", [("Transfer-Encoding", "chunked")], b"abcd").raw()
    head = b"POST /v2 HTTP/1.1\r\nHost: soak\r\nConnection: close\r\nX: 1\r\nX: 2\r\n"
    assert plain == head + b"Content-Length: 4\r\n\r\nabcd"
    assert chunked.endswith(b"Transfer-Encoding: chunked\r\n\r\n2\r\nab\r\n2\r\ncd\r\n0\r\n\r\n")
    assert b"Content-Length" not in chunked
