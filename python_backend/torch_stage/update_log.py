"""A write-ahead log of embedding row updates, so an acknowledged update survives a stub or server restart.

The embedding stage appends each update (after it is validated, before it is applied and acknowledged)
as one record and fsyncs; ``initialize`` replays the log onto the freshly loaded tables. The log lives
in the stage's version folder, so rebuilding the stage (new weights) starts a new log. A record torn by a
crash mid-write fails its checksum and is cut off at replay: it was never acknowledged.

Record: ``MAGIC``, rows, width, crc32 of the payload, then int64 table[rows], int64 row[rows],
float32 values[rows × width]. Standard library and torch only: it runs inside the stub.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator

import torch

MAGIC = b"EWL1"
HEADER = struct.Struct("<4sIII")
LOG_NAME = "live_updates.wal"


def encode(table: torch.Tensor, row: torch.Tensor, values: torch.Tensor) -> bytes:
    table = table.reshape(-1).to(torch.int64).contiguous()
    row = row.reshape(-1).to(torch.int64).contiguous()
    values = values.to(torch.float32).contiguous()
    rows, width = int(table.shape[0]), int(values.shape[1]) if values.dim() == 2 else 0
    payload = table.numpy().tobytes() + row.numpy().tobytes() + values.numpy().tobytes()
    return HEADER.pack(MAGIC, rows, width, zlib.crc32(payload)) + payload


def append(path: str, table: torch.Tensor, row: torch.Tensor, values: torch.Tensor) -> None:
    """Append one update durably (one ``write`` on an ``O_APPEND`` descriptor, then ``fsync``)."""
    record = encode(table.cpu(), row.cpu(), values.cpu())
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        written = os.write(descriptor, record)
        if written != len(record):
            raise OSError(f"short write to {path}: {written} of {len(record)} bytes")
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def replay(path: str) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Every whole record in order; a torn or corrupt tail is truncated away (never acknowledged)."""
    if not os.path.exists(path):
        return
    with open(path, "rb") as handle:
        data = handle.read()
    offset = 0
    while offset + HEADER.size <= len(data):
        magic, rows, width, crc = HEADER.unpack_from(data, offset)
        size = rows * 16 + rows * width * 4
        start = offset + HEADER.size
        payload = data[start : start + size]
        if magic != MAGIC or len(payload) != size or zlib.crc32(payload) != crc:
            break
        ids = torch.frombuffer(bytearray(payload[: rows * 16]), dtype=torch.int64)
        values = torch.frombuffer(bytearray(payload[rows * 16 :]), dtype=torch.float32).reshape(rows, width)
        yield ids[:rows], ids[rows:], values
        offset = start + size
    if offset != len(data):
        os.truncate(path, offset)
