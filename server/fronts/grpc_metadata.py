"""What a gRPC call's metadata may be before the front forwards it (fault matrix row 69): Triton's
grpc-core resets a call whose headers break gRPC's grammar (``INTERNAL``) and refuses at random
above 8 KiB of metadata, so the front forwards only what the grammar allows in a size Triton always
takes, and refuses the rest with ``INVALID_ARGUMENT`` naming the header.
"""

from __future__ import annotations

import binascii
import re

# gRPC over HTTP/2: Header-Name 1*( %x30-39 / %x61-7A / "_" / "-" / "." ), ASCII-Value 1*( %x20-%x7E );
# values of names ending in -bin are base64 (grpc-core also takes them without padding)
NAME = re.compile(rb"[0-9a-z_.-]+")
ASCII_VALUE = re.compile(rb"[\x20-\x7e]*")
BINARY_SUFFIX = b"-bin"
# Counted as HPACK and grpc-core count a header list (name + value + 32 per field). Triton refuses at
# random above 8 KiB of headers; the front adds its own (path, authority, timeout, key: about 500
# bytes), so a client's metadata may take half of that.
MAX_METADATA_BYTES = 4 << 10
FIELD_OVERHEAD = 32


def metadata_fault(headers: list[tuple[bytes, bytes]]) -> str | None:
    """Why Triton's gRPC would not take the call's metadata (``headers`` less the pseudo-headers), or
    None when it would."""
    size = 0
    for name, value in headers:
        if name.startswith(b":"):
            continue
        size += len(name) + len(value) + FIELD_OVERHEAD
        shown = name.decode("latin-1")
        if not NAME.fullmatch(name):
            return f"metadata name {shown!r} is not gRPC's: lower-case letters, digits, '_', '-' and '.' only"
        if name.endswith(BINARY_SUFFIX):
            if not _is_base64(value):
                return f"metadata '{shown}' ends in -bin but its value is not base64"
        elif not ASCII_VALUE.fullmatch(value):
            return f"metadata '{shown}' holds a byte outside printable ASCII (0x20-0x7E); send it as -bin"
    if size > MAX_METADATA_BYTES:
        return f"the call's metadata takes {size} bytes, above the {MAX_METADATA_BYTES} the front forwards"
    return None


def _is_base64(value: bytes) -> bool:
    if len(value) % 4 == 1:
        return False
    try:
        binascii.a2b_base64(value + b"=" * (-len(value) % 4), strict_mode=True)
    except binascii.Error:
        return False
    return True
