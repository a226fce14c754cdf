"""The headers the invariant fuzz draws (``soak.fuzz_headers``) without a server
(tests/faults/test_invariant_fuzz.py sends them to the real one): every name in the drawn casing, a
body encoded as its ``Content-Encoding`` says (the front's own ``inflate`` reads it back, and refuses
the mismatch), a ``Content-Type`` that fits the body, and the judging of what came back."""

from __future__ import annotations

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hypothesis_seed

from server.fronts.body_checks import inflate
from server.fronts.grpc_wire import MessageReader, metadata_fault
from server.fronts.refusal import RequestRefusedError
from soak.fuzz_headers import (
    ACCEPT_COMPRESSED_FIRST,
    ACCEPT_ENCODINGS,
    CASINGS,
    MISMATCH,
    VALID_METADATA,
    WIRE_FAULTS,
    HeaderCase,
    accepted,
    compressed_accepted,
    grpc_compression,
    header_cases,
    headers_held,
    headers_reached,
    http_headers,
    mixed_case,
    readable,
    wire_held,
)
from soak.fuzz_wire import carried, http_body
from soak.raw_http import HttpReply
from soak.request_space import Case, TensorCase

BODY = b'{"inputs": []}'
LIMIT = 1 << 20


def test_the_plain_headers_are_the_fuzzs_own() -> None:
    """No ``HeaderCase`` (a case printed before headers were drawn, the other user's plain request): JSON,
    or octet-stream with the JSON header's length where binary data follow."""
    assert http_headers(None, None, BODY) == ([("Content-Type", "application/json")], BODY)
    binary = [("Content-Type", "application/octet-stream"), ("Inference-Header-Content-Length", "14")]
    assert http_headers(None, 14, BODY + b"\x00") == (binary, BODY + b"\x00")


@pytest.mark.parametrize("casing", CASINGS)
def test_every_name_the_request_sends_is_in_the_drawn_casing(casing: str) -> None:
    headers = HeaderCase(casing, "gzip", "deflate", "application/octet-stream")
    tensor = TensorCase("x", "FP32", (1, 1), "binary", 1)
    case = Case("trivial", "http", (tensor,), None, 0, headers=headers)
    request = http_body(case, [carried(tensor, None, 0)], [None], [])
    head = request.raw().split(b"\r\n\r\n", 1)[0].decode()
    names = [line.split(":", 1)[0] for line in head.split("\r\n")[1:]]
    canonical = [
        "Host", "Connection", "Content-Type", "Inference-Header-Content-Length", "Content-Encoding",
        "Accept-Encoding", "Content-Length",
    ]  # fmt: skip
    assert names == [CASINGS[casing](name) for name in canonical]


def test_mixed_case_alternates_the_letters() -> None:
    assert mixed_case("Content-Type") == "cOnTeNt-tYpE"
    assert mixed_case("Content-Type").lower() == "content-type" and mixed_case("ab") not in ("ab", "AB")


@pytest.mark.parametrize("encoding", ["gzip", "deflate", ""])
def test_a_body_is_encoded_as_its_header_says_and_the_front_reads_it_back(encoding: str) -> None:
    headers, body = http_headers(HeaderCase(content_encoding=encoding), None, BODY)
    declared = dict(headers).get("Content-Encoding")
    assert declared == (encoding or None)
    assert inflate(body, declared, LIMIT) == BODY
    assert (body != BODY) == bool(encoding)


def test_a_mismatch_declares_gzip_over_plain_bytes_which_the_front_refuses() -> None:
    headers, body = http_headers(HeaderCase(content_encoding=MISMATCH), None, BODY)
    assert dict(headers)["Content-Encoding"] == "gzip" and body == BODY
    with pytest.raises(RequestRefusedError):
        inflate(body, "gzip", LIMIT)
    assert readable(HeaderCase(content_encoding=MISMATCH)) == HeaderCase(content_encoding="gzip")
    assert readable(None) is None


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@hypothesis_seed(0)
@given(header_cases("http", binary=False), header_cases("grpc", binary=True))
def test_a_draw_fits_its_protocol_and_body(http: HeaderCase, grpc_case: HeaderCase) -> None:
    """A JSON body is never declared octet-stream; a gRPC case draws its message's compression or a
    fault of its wire form, never both."""
    assert http.casing in CASINGS and http.accept_encoding in ACCEPT_ENCODINGS
    assert http.content_type != "application/octet-stream" and not http.compression and not http.wire
    assert grpc_case == HeaderCase(content_type="", compression=grpc_case.compression, wire=grpc_case.wire)
    assert grpc_case.wire in ("", *WIRE_FAULTS) and not (grpc_case.wire and grpc_case.compression)
    assert grpc_compression(grpc_case) in (None, grpc.Compression.Gzip, grpc.Compression.Deflate)


@settings(max_examples=50, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@hypothesis_seed(0)
@given(header_cases("http", binary=True, shm_output=True))
def test_an_output_into_a_region_draws_from_every_accept_encoding(headers: HeaderCase) -> None:
    assert headers.accept_encoding in ACCEPT_COMPRESSED_FIRST
    assert set(ACCEPT_COMPRESSED_FIRST) == set(ACCEPT_ENCODINGS)


@pytest.mark.parametrize(
    ("accept", "answered", "read"),
    [
        ("", "gzip", True),  # no Accept-Encoding: any encoding will do (RFC 9110)
        ("identity", "", True),
        ("identity", "gzip", False),
        ("gzip", "gzip", True),
        ("gzip", "deflate", False),
        ("gzip, deflate", "deflate", True),
        ("GZIP;q=1.0", "gzip", True),
    ],
)
def test_an_answer_is_read_only_in_an_encoding_the_request_accepts(
    accept: str, answered: str, read: bool
) -> None:
    assert accepted(accept, answered) is read


def test_the_headers_break_invariant_a_where_a_client_could_not_use_the_answer() -> None:
    mismatch = HeaderCase(content_encoding=MISMATCH)
    assert headers_held(mismatch, HttpReply(400, b"{}"), "refused") == []
    assert "not refused" in headers_held(mismatch, HttpReply(200, b"{}"), "ok")[0]
    unasked = headers_held(
        HeaderCase(accept_encoding="identity"), HttpReply(200, b"{}", encoding="gzip"), "ok"
    )
    assert "does not accept" in unasked[0]
    assert headers_held(None, HttpReply(200, b"{}", encoding="br"), "ok") == []
    assert headers_held(mismatch, HttpReply(failure="hang"), "broken") == []  # judged as no answer


def test_what_a_case_reached_through_its_headers() -> None:
    headers = HeaderCase("lower", "gzip, deflate")
    reached = headers_reached(headers, HttpReply(200, b"{}", encoding="gzip"), "ok", shm_output=True)
    assert reached == {
        "ok http lower header names": 1,
        "ok http answer in gzip": 1,
        "ok http shared-memory output, compressed answer accepted": 1,
    }
    refused = headers_reached(HeaderCase(content_encoding=MISMATCH), HttpReply(400), "refused", False)
    assert refused == {"refused http canonical header names": 1, f"refused http {MISMATCH} body": 1}
    assert compressed_accepted(headers) and not compressed_accepted(HeaderCase(accept_encoding="identity"))
    assert not headers_reached(None, HttpReply(200), "ok", shm_output=True)


def test_wire_faults_are_what_they_are_named_and_must_be_refused() -> None:
    request = b"\x0a\x07trivial"
    reader = MessageReader(1 << 20)
    assert len(reader.feed(WIRE_FAULTS["two messages"](request)[1])) == 2
    assert WIRE_FAULTS["no message"](request)[1] == b""
    cut = MessageReader(1 << 20)
    assert cut.feed(WIRE_FAULTS["length prefix says more"](request)[1]) == [] and cut.pending
    assert metadata_fault(WIRE_FAULTS[VALID_METADATA](request)[0]) is None
    for name in ("upper-case metadata name", "metadata name with a space", "-bin metadata not base64"):
        assert metadata_fault(WIRE_FAULTS[name](request)[0]) is not None
    assert wire_held(HeaderCase(wire="two messages"), "ok") and not wire_held(
        HeaderCase(wire="two messages"), "refused"
    )
    assert not wire_held(HeaderCase(wire=VALID_METADATA), "ok") and not wire_held(None, "ok")
