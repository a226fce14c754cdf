"""``Content-Encoding`` bodies inflated by the front, bounded, and forwarded plain: Triton inflates gzip
itself, so the checked body must be the one it runs.
"""

from __future__ import annotations

import zlib

from server.fronts.refusal import Refusal, RequestRefusedError

WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}  # deflate is the zlib format (RFC 9110)


def inflate(body: bytes, encoding: str | None, limit: int) -> bytes:
    """``body`` decoded from ``encoding``: 415 for an unknown one, 400 if it does not inflate, 413."""
    name = (encoding or "identity").strip().lower()
    if name == "identity":
        return body
    if name not in WBITS:
        raise RequestRefusedError(
            f"Content-Encoding {encoding[:40]!r} is not supported; send gzip, deflate or no encoding",
            Refusal.UNSUPPORTED,
        )
    decoder = zlib.decompressobj(WBITS[name])
    try:
        plain = decoder.decompress(body, limit + 1)
    except zlib.error as error:
        raise RequestRefusedError(f"request body is not valid {name} data: {error}") from error
    if len(plain) > limit or decoder.unconsumed_tail:
        raise RequestRefusedError(f"request body inflates to more than {limit} bytes", Refusal.TOO_LARGE)
    if not decoder.eof or decoder.unused_data:
        raise RequestRefusedError(f"request body is not one complete {name} stream")
    return plain
