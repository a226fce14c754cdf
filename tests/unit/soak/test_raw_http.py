"""The soak's one rule for what an HTTP exchange got back (``soak.raw_http``), on the bytes a connection
delivered: an answer only when its status line and whole body came; a connection that ended first, or
a first line that is no status line, is no answer for every caller alike; a compressed answer is read
decoded, as a client reads it."""

from __future__ import annotations

import gzip
import zlib

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
    assert reply_in(received, ended)[0] == reply


@pytest.mark.parametrize(
    "received", [b"", b"HTTP/1.1 200 OK\r\n", ANSWER + b"{", b"HTTP/1.1 200 OK\r\n\r\n{}"]
)
def test_more_is_awaited_while_the_connection_lasts(received: bytes) -> None:
    assert reply_in(received, ended=False)[0] is None


def test_the_bytes_after_an_answer_are_the_next_pipelined_answers() -> None:
    """Requests written back to back on one connection are answered back to back: an answer ends at
    its ``Content-Length``, and what follows is read as the next one's."""
    assert reply_in(ANSWER + ERROR + ANSWER, ended=False) == (HttpReply(400, ERROR), ANSWER)
    assert reply_in(ANSWER + ERROR, ended=False) == (HttpReply(400, ERROR), b"")
    assert reply_in(ANSWER, ended=False) == (None, ANSWER)  # not whole yet: kept until more comes


@pytest.mark.parametrize("ended", [False, True])
def test_the_answer_to_a_head_is_whole_at_its_headers(ended: bool) -> None:
    """A HEAD's answer has no body whatever its ``Content-Length`` says (RFC 9110): read to that
    length, every HEAD answered with one was "closed: 0 of its 13 body bytes"."""
    assert reply_in(ANSWER, ended, head_only=True)[0] == HttpReply(400, b"")
    assert reply_in(ANSWER, ended)[0] == (
        HttpReply(failure="closed: 0 of its 13 body bytes") if ended else None
    )


def test_a_request_asks_to_close_and_is_framed_by_its_headers() -> None:
    plain = Request("POST", "/v2", [("X", "1"), ("X", "2")], b"abcd").raw()
    chunked = Request("POST", "/v2", [("Transfer-Encoding", "chunked")], b"abcd").raw()
    head = b"POST /v2 HTTP/1.1\r\nHost: soak\r\nConnection: close\r\nX: 1\r\nX: 2\r\n"
    assert plain == head + b"Content-Length: 4\r\n\r\nabcd"
    assert chunked.endswith(b"Transfer-Encoding: chunked\r\n\r\n2\r\nab\r\n2\r\ncd\r\n0\r\n\r\n")
    assert b"Content-Length" not in chunked


def _encoded_answer(encoding: bytes, body: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-ENCODING: %s\r\nContent-Length: %d\r\n\r\n" % (encoding, len(body))
    return head + body


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [(b"gzip", gzip.compress), (b"deflate", zlib.compress), (b"GZIP", gzip.compress)],
)
def test_a_compressed_answer_is_read_as_a_client_reads_it(encoding: bytes, compress) -> None:
    """The body a client sees, decoded from what its ``Content-Encoding`` names (in any case), and that
    encoding, so a caller can tell a compressed answer was read back."""
    reply, _ = reply_in(_encoded_answer(encoding, compress(ERROR)), ended=False)
    assert reply == HttpReply(200, ERROR, encoding=encoding.decode().lower())


# mtime 0: gzip stamps the time it compressed, and a test id holding that stamp differs between the
# workers of `make test` that collect it a second apart (pytest-xdist refuses to run them)
GZIPPED = gzip.compress(ERROR, mtime=0)


@pytest.mark.parametrize(
    ("received", "failure"),
    [
        (_encoded_answer(b"gzip", ERROR), "undecodable: a 200 in gzip"),  # declared gzip, sent plain
        (_encoded_answer(b"deflate", GZIPPED), "undecodable: a 200 in deflate"),
        (_encoded_answer(b"gzip", GZIPPED[:-3]), "undecodable: a 200 not one whole gzip"),
        (_encoded_answer(b"gzip", GZIPPED + b"x"), "undecodable: a 200 not one whole gzip"),
    ],
    ids=["gzip-over-plain", "deflate-over-gzip", "gzip-cut-short", "gzip-with-trailing-bytes"],
)
def test_an_answer_its_encoding_does_not_decode_is_no_answer(received: bytes, failure: str) -> None:
    reply, _ = reply_in(received, ended=False)
    assert reply is not None and reply.failure.startswith(failure) and not reply.body


def test_an_empty_or_unknown_encoding_is_kept_as_sent() -> None:
    assert reply_in(_encoded_answer(b"gzip", b""), ended=False)[0] == HttpReply(200, b"", encoding="gzip")
    assert reply_in(_encoded_answer(b"br", b"\x0b"), ended=False)[0] == HttpReply(200, b"\x0b", encoding="br")


def test_the_framing_names_are_written_by_the_requests_casing() -> None:
    raw = Request("POST", "/v2", [("x-a", "1")], b"ab", name_case=str.lower).raw()
    assert (
        raw
        == b"POST /v2 HTTP/1.1\r\nhost: soak\r\nconnection: close\r\nx-a: 1\r\ncontent-length: 2\r\n\r\nab"
    )
