"""A write-ahead log of embedding row updates, so an acknowledged update survives a stub or server restart.

The embedding stage appends each update (after it is validated, before it is applied and acknowledged)
as one record and fsyncs; ``initialize`` replays the log onto the freshly loaded tables. The log lives
in the stage's version folder, so rebuilding the stage (new weights) starts a new log. A record torn by a
crash mid-write fails its checksum and is cut off at replay: it was never acknowledged.

The log is bounded by the tables, not by the number of updates: once it is larger than
``COMPACT_BYTES`` and than twice its last snapshot, ``UpdateLog`` rewrites it as a snapshot (the
current values of every row ever updated, after a base record carrying the update count, so the
version answered to clients keeps counting), written beside it, fsynced and renamed over it: a crash
leaves either the old log or the new one whole.

Update record: ``MAGIC``, rows, width, crc32 of the payload, then int64 table[rows], int64 row[rows],
float32 values[rows × width]. Base record (a snapshot's first): ``BASE_MAGIC``, 0, 0, crc32, then
int64 the updates the snapshot stands for and int64 the update records after it that make it up.
Standard library and torch only: it runs inside the stub.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable, Iterator, Sequence

import torch

MAGIC = b"EWL1"
BASE_MAGIC = b"EWLB"
HEADER = struct.Struct("<4sIII")
BASE = struct.Struct("<qq")  # updates the snapshot stands for, records it is made of
LOG_NAME = "live_updates.wal"
COMPACT_BYTES = 64 << 20
Record = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # table ids [N], row ids [N], values [N, D]


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


def encode_base(updates: int, records: int) -> bytes:
    payload = BASE.pack(updates, records)
    return HEADER.pack(BASE_MAGIC, 0, 0, zlib.crc32(payload)) + payload


def read(path: str) -> tuple[int, list[Record]]:
    """The number of updates the log stands for, and every whole record in order (a snapshot's, then
    later updates); a torn or corrupt tail is truncated away (never acknowledged)."""
    if not os.path.exists(path):
        return 0, []
    with open(path, "rb") as handle:
        data = handle.read()
    base, snapshot, records, offset = 0, 0, [], 0
    while offset + HEADER.size <= len(data):
        magic, rows, width, crc = HEADER.unpack_from(data, offset)
        size = BASE.size if magic == BASE_MAGIC else rows * 16 + rows * width * 4
        start = offset + HEADER.size
        payload = data[start : start + size]
        if magic not in (MAGIC, BASE_MAGIC) or len(payload) != size or zlib.crc32(payload) != crc:
            break
        if magic == BASE_MAGIC:
            base, snapshot = BASE.unpack(payload)
        else:
            ids = torch.frombuffer(bytearray(payload[: rows * 16]), dtype=torch.int64)
            values = torch.frombuffer(bytearray(payload[rows * 16 :]), dtype=torch.float32)
            records.append((ids[:rows], ids[rows:], values.reshape(rows, width)))
        offset = start + size
    if offset != len(data):
        os.truncate(path, offset)
    return base + len(records) - snapshot, records


def replay(path: str) -> Iterator[Record]:
    """Every whole update record in order (see ``read``)."""
    yield from read(path)[1]


class UpdateLog:
    """The log of one embedding stage: replays onto its tables, appends updates, compacts itself.

    ``version`` counts the updates applied since the stage was built (what an update request is
    answered); ``touched`` holds, per table, the rows any update wrote: the rows a snapshot keeps.
    """

    def __init__(self, path: str, tables: Sequence[torch.Tensor], compact_bytes: int = COMPACT_BYTES) -> None:
        self.path, self.tables, self.compact_bytes = path, tables, compact_bytes
        self.touched: list[set[int]] = [set() for _ in tables]
        self.version = 0
        self.snapshot_bytes = 0  # the log's size after its last snapshot

    def replay(self, apply: Callable[..., object]) -> None:
        """Apply every logged update with ``apply(tables, table, row, values)``, then compact if due."""
        self.version, records = read(self.path)
        for record in records:
            apply(self.tables, *record)
            self._touch(record[0], record[1])
        self._compact_if_due()

    def append(self, table: torch.Tensor, row: torch.Tensor, values: torch.Tensor) -> None:
        """Log one validated update durably (before it is applied and acknowledged)."""
        append(self.path, table, row, values)
        self._touch(table, row)
        self.version += 1

    def after_apply(self) -> None:
        """Compact if due: called once the update is in the tables, so the snapshot holds it."""
        self._compact_if_due()

    def _touch(self, table: torch.Tensor, row: torch.Tensor) -> None:
        for t, r in zip(table.reshape(-1).tolist(), row.reshape(-1).tolist(), strict=True):
            self.touched[t].add(r)

    def _compact_if_due(self) -> None:
        size = os.path.getsize(self.path) if os.path.exists(self.path) else 0
        if size > max(self.compact_bytes, 2 * self.snapshot_bytes):
            self.compact()

    def compact(self) -> None:
        """Rewrite the log as a snapshot of the touched rows' current values (atomic rename)."""
        parts = []
        for index, rows in enumerate(self.touched):
            if rows:
                row = torch.tensor(sorted(rows), dtype=torch.int64)
                table = self.tables[index].detach()
                values = table[row.to(table.device)].cpu()
                parts.append(encode(torch.full_like(row, index), row, values))
        parts.insert(0, encode_base(self.version, len(parts)))
        temporary = f"{self.path}.compacting"
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for part in parts:
                view = memoryview(part)
                while view:  # a large snapshot may take more than one write
                    view = view[os.write(descriptor, view) :]
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        os.replace(temporary, self.path)
        folder = os.open(os.path.dirname(self.path) or ".", os.O_RDONLY)
        try:
            os.fsync(folder)  # the rename itself is durable
        finally:
            os.close(folder)
        self.snapshot_bytes = os.path.getsize(self.path)
