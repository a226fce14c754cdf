"""The one way out of the sandbox: named byte strings in frames on a pipe, read back within bounds.

The sandbox has no writable folder the parent reads, so no file it leaves (a link to a secret, a
million small files) can reach the parent. Its results travel as ``MAGIC``, then for each file a
name length, the name, a byte count and the bytes. ``read_frames`` accepts only the names the caller
expects, each once, and nothing malformed.
"""

from __future__ import annotations

import struct
from typing import BinaryIO

MAGIC = b"SANDBOX1"
HEADER = struct.Struct("<HQ")  # name length, byte count


class FrameError(ValueError):
    """What came out of the sandbox is not frames of the expected files."""


def write_frames(stream: BinaryIO, files: dict[str, bytes]) -> None:
    stream.write(MAGIC)
    for name, data in files.items():
        raw = name.encode()
        stream.write(HEADER.pack(len(raw), len(data)) + raw)
        stream.write(data)
    stream.flush()


def read_frames(data: bytes, allowed: frozenset[str]) -> dict[str, bytes]:
    """The files in ``data``; ``FrameError`` unless every name is in ``allowed`` and appears once."""
    if not data.startswith(MAGIC):
        raise FrameError("it sent no results (the output does not start with the sandbox's frame marker)")
    files: dict[str, bytes] = {}
    position = len(MAGIC)
    while position < len(data):
        if position + HEADER.size > len(data):
            raise FrameError("its output ends inside a frame header")
        name_length, size = HEADER.unpack_from(data, position)
        position += HEADER.size
        name = data[position : position + name_length].decode("utf-8", errors="replace")
        position += name_length
        if name not in allowed or name in files:
            raise FrameError(f"it sent a file {name[:80]!r} that was not asked for, or twice")
        if position + size > len(data):
            raise FrameError(f"its output ends inside {name!r}")
        files[name] = data[position : position + size]
        position += size
    return files
