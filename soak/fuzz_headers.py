"""The headers of the invariant fuzz's requests, drawn like the rest of a case, so a front that reads a
header differently from one client to the next is found; over gRPC, the compression or a wire fault
(``WIRE_FAULTS``) that grpcio will not send."""

from __future__ import annotations

import gzip
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace

import grpc
from hypothesis import strategies as st

from soak.raw_grpc import message
from soak.raw_http import HttpReply


def mixed_case(name: str) -> str:
    """``name`` with its letters alternately upper and lower case (``cOnTeNt-tYpE``)."""
    return "".join(c.upper() if i % 2 else c.lower() for i, c in enumerate(name))


CASINGS: dict[str, Callable[[str], str]] = {
    "canonical": str,
    "lower": str.lower,
    "upper": str.upper,
    "mixed": mixed_case,
}
ACCEPT_ENCODINGS = ("", "identity", "gzip", "deflate", "gzip, deflate")  # "": no Accept-Encoding
# For an output in a region the front reads Triton's answer itself: compressed first, where hypothesis
# draws most often, as such valid requests are rare
ACCEPT_COMPRESSED_FIRST = ("gzip", "deflate", "gzip, deflate", "", "identity")
MISMATCH = "gzip-plain"  # declared gzip, sent plain: the front must refuse it (4xx)
# a mismatch one draw in ten, away from the tuple's ends (hypothesis draws those more often)
CONTENT_ENCODING_DRAWS = ("", "gzip", "deflate", "", "gzip", MISMATCH, "deflate", "", "gzip", "deflate")
JSON_TYPES = (
    "application/json",
    "application/json; charset=utf-8",
    "application/x-www-form-urlencoded",  # what curl -d sends
    "application/x-www-form-urlencoded; charset=utf-8",
    "",  # none at all, as tritonclient sends a JSON inference
)
BINARY_TYPES = (*JSON_TYPES, "application/octet-stream")
GRPC_COMPRESSIONS = {"": None, "gzip": grpc.Compression.Gzip, "deflate": grpc.Compression.Deflate}
VALID_METADATA = "valid metadata"
GZIP_ENCODING = [(b"grpc-encoding", b"gzip")]
# a wire fault's name -> (the metadata it adds, the call's DATA from its one serialized message)
WIRE_FAULTS: dict[str, Callable[[bytes], tuple[list[tuple[bytes, bytes]], bytes]]] = {
    VALID_METADATA: lambda m: ([(b"x-fuzz", b"a b~"), (b"x-fuzz-bin", b"AAE")], message(m)),
    "upper-case metadata name": lambda m: ([(b"X-Fuzz", b"1")], message(m)),
    "metadata name with a space": lambda m: ([(b"x fuzz", b"1")], message(m)),
    "metadata value with a control byte": lambda m: ([(b"x-fuzz", b"a\x00b")], message(m)),
    "-bin metadata not base64": lambda m: ([(b"x-fuzz-bin", b"!!!!")], message(m)),
    "12 KiB of metadata": lambda m: ([(b"x-fuzz", b"a" * (12 << 10))], message(m)),
    "two messages": lambda m: ([], message(m) * 2),
    "no message": lambda m: ([], b""),
    "length prefix says more": lambda m: ([], b"\x00" + (len(m) + 1).to_bytes(4, "big") + m),
    "compressed flag, no grpc-encoding": lambda m: ([], message(gzip.compress(m, mtime=0), flag=1)),
    "gzip that does not unpack": lambda m: (GZIP_ENCODING, message(b"\x00not gzip" + m, flag=1)),
}
# none two times in three; the faults not at either end, where hypothesis draws more often
WIRE_DRAWS = ("", *WIRE_FAULTS, *[""] * (len(WIRE_FAULTS) - 1), "")


@dataclass(frozen=True)
class HeaderCase:
    """How one request's headers are written ("": a header not sent); ``wire`` is a key of ``WIRE_FAULTS``."""

    casing: str = "canonical"
    accept_encoding: str = ""
    content_encoding: str = ""
    content_type: str = "application/json"
    compression: str = ""
    wire: str = ""  # a key of WIRE_FAULTS: a gRPC call written by soak.raw_grpc

    @property
    def mismatched(self) -> bool:
        return self.content_encoding == MISMATCH


@st.composite
def header_cases(draw: st.DrawFn, protocol: str, binary: bool, shm_output: bool = False) -> HeaderCase:
    """The headers of a request on ``protocol``, each part drawn on its own."""
    if protocol != "http":
        wire = draw(st.sampled_from(WIRE_DRAWS)) if protocol == "grpc" else ""
        compression = "" if wire else draw(st.sampled_from(tuple(GRPC_COMPRESSIONS)))
        return HeaderCase(content_type="", compression=compression, wire=wire)
    return HeaderCase(
        casing=draw(st.sampled_from(tuple(CASINGS))),
        accept_encoding=draw(st.sampled_from(ACCEPT_COMPRESSED_FIRST if shm_output else ACCEPT_ENCODINGS)),
        content_encoding=draw(st.sampled_from(CONTENT_ENCODING_DRAWS)),
        content_type=draw(st.sampled_from(BINARY_TYPES if binary else JSON_TYPES)),
    )


def encoded(body: bytes, encoding: str) -> bytes:
    """``body`` under ``Content-Encoding: encoding``, at the fastest level."""
    if encoding == "gzip":
        return gzip.compress(body, compresslevel=1, mtime=0)
    if encoding == "deflate":
        return zlib.compress(body, 1)
    return body


def http_headers(
    headers: HeaderCase | None, header_length: int | None, body: bytes
) -> tuple[list[tuple[str, str]], bytes]:
    """An inference's headers and body as ``headers`` writes them (None: the fuzz's plain ones)."""
    if headers is None:
        binary = header_length is not None
        headers = HeaderCase(content_type="application/octet-stream" if binary else "application/json")
    named = [  # "": not sent
        ("Content-Type", headers.content_type),
        ("Inference-Header-Content-Length", "" if header_length is None else str(header_length)),
        ("Content-Encoding", headers.content_encoding.removesuffix("-plain")),
        ("Accept-Encoding", headers.accept_encoding),
    ]
    case = CASINGS[headers.casing]
    return [(case(name), value) for name, value in named if value], encoded(body, headers.content_encoding)


def readable(headers: HeaderCase | None) -> HeaderCase | None:
    """``headers`` with a mismatched body encoding made a true one: for a request that must be read."""
    return (
        replace(headers, content_encoding="gzip") if headers is not None and headers.mismatched else headers
    )


def compressed_accepted(headers: HeaderCase | None) -> bool:
    """Whether the request asks for a compressed answer (gzip or deflate)."""
    return headers is not None and headers.accept_encoding not in ("", "identity")


def grpc_compression(headers: HeaderCase | None) -> grpc.Compression | None:
    return GRPC_COMPRESSIONS[headers.compression] if headers is not None else None


def wire_held(headers: HeaderCase | None, verdict: str) -> list[str]:
    """A wire fault must be refused, never run (valid metadata aside)."""
    if headers is None or headers.wire in ("", VALID_METADATA) or verdict != "ok":
        return []
    return [f"a call with {headers.wire} was answered OK, not refused"]


def accepted(accept_encoding: str, answered: str) -> bool:
    """Whether a client that sent ``accept_encoding`` ("" accepts any) reads an answer in ``answered``."""
    if answered in ("", "identity") or not accept_encoding:
        return True
    return answered in [part.split(";")[0].strip() for part in accept_encoding.lower().split(",")]


def headers_held(headers: HeaderCase | None, reply: HttpReply, verdict: str) -> list[str]:
    """A body declared gzip but sent plain must be refused; an answer must come in an accepted encoding."""
    if headers is None or reply.failure:
        return []
    problems = []
    if headers.mismatched and verdict == "ok":
        problems.append(f"a body declared gzip but sent plain was answered {reply.status}, not refused")
    if not accepted(headers.accept_encoding, reply.encoding):
        asked = headers.accept_encoding
        problems.append(f"answered in {reply.encoding!r}, which Accept-Encoding {asked!r} does not accept")
    return problems


def headers_reached(headers: HeaderCase | None, reply: HttpReply, verdict: str, shm_output: bool) -> Counter:
    """What an HTTP case reached through its headers (the run's coverage)."""
    if headers is None:
        return Counter()
    reached = Counter([f"{verdict} http {headers.casing} header names"])
    if headers.mismatched:
        reached[f"{verdict} http {MISMATCH} body"] += 1
    if verdict == "ok" and reply.encoding not in ("", "identity"):
        reached[f"ok http answer in {reply.encoding}"] += 1
    if verdict == "ok" and shm_output and compressed_accepted(headers):
        reached["ok http shared-memory output, compressed answer accepted"] += 1
    return reached
