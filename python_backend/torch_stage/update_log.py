"""A write-ahead log of embedding row updates, so an acknowledged update survives a stub or server restart.

Each validated update is appended and fsynced before it is applied and acknowledged; ``initialize``
replays the log, and a record torn by a crash fails its checksum and is cut off. The first record
names the artifact (SHA-256) the updates apply to: after a rebuild the log is set aside, not replayed
onto new weights. Past ``COMPACT_BYTES`` (and twice its last snapshot) the log is rewritten as a
snapshot of every row ever updated, renamed over it, so it is bounded by the tables.

Records: a header (magic, rows, width, crc32 of the payload), then the payload. ``MAGIC``: int64
table[rows], int64 row[rows], float32 values[rows × width]. ``BASE_MAGIC`` (a snapshot's first): int64
updates it stands for, int64 records it is made of. ``ARTIFACT_MAGIC``: the 32-byte SHA-256.
"""

from __future__ import annotations

import os
import struct
import time
import zlib
from collections.abc import Callable, Sequence

import torch

try:  # beside model.py inside the stub
    from atomic_files import fsync, staged
except ImportError:  # imported as a package (unit tests)
    from python_backend.atomic_files import fsync, staged

MAGIC = b"EWL1"
BASE_MAGIC = b"EWLB"
ARTIFACT_MAGIC = b"EWLA"
ARTIFACT_BYTES = 32  # a SHA-256
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
    return _record(MAGIC, payload, rows, width)


def _record(magic: bytes, payload: bytes, rows: int = 0, width: int = 0) -> bytes:
    return HEADER.pack(magic, rows, width, zlib.crc32(payload)) + payload


def encode_artifact(artifact: str) -> bytes:
    """The record naming the artifact (hex SHA-256) a log's updates apply to; b"" when unknown."""
    return _record(ARTIFACT_MAGIC, bytes.fromhex(artifact)) if artifact else b""


def append(
    path: str, table: torch.Tensor, row: torch.Tensor, values: torch.Tensor, first: bytes = b""
) -> None:
    """Append one update durably (one ``write``, then ``fsync``); ``first`` opens a new log."""
    record = encode(table.cpu(), row.cpu(), values.cpu())
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        if first and os.fstat(descriptor).st_size == 0:
            record = first + record
        written = os.write(descriptor, record)
        if written != len(record):
            raise OSError(f"short write to {path}: {written} of {len(record)} bytes")
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def read(path: str) -> tuple[int, list[Record]]:
    """The number of updates the log stands for, and every whole record in order; a torn tail (never
    acknowledged) is truncated away."""
    if not os.path.exists(path):
        return 0, []
    with open(path, "rb") as handle:
        data = handle.read()
    base, snapshot, records, offset = 0, 0, [], 0
    while offset + HEADER.size <= len(data):
        magic, rows, width, crc = HEADER.unpack_from(data, offset)
        size = {BASE_MAGIC: BASE.size, ARTIFACT_MAGIC: ARTIFACT_BYTES}.get(
            magic, rows * 16 + rows * width * 4
        )
        start = offset + HEADER.size
        payload = data[start : start + size]
        known = (MAGIC, BASE_MAGIC, ARTIFACT_MAGIC)
        if magic not in known or len(payload) != size or zlib.crc32(payload) != crc:
            break
        if magic == BASE_MAGIC:
            base, snapshot = BASE.unpack(payload)
        elif magic == MAGIC:  # an artifact record only names the artifact (``artifact_of``)
            ids = torch.frombuffer(bytearray(payload[: rows * 16]), dtype=torch.int64)
            values = torch.frombuffer(bytearray(payload[rows * 16 :]), dtype=torch.float32)
            records.append((ids[:rows], ids[rows:], values.reshape(rows, width)))
        offset = start + size
    if offset != len(data):
        os.truncate(path, offset)
    return base + len(records) - snapshot, records


def artifact_of(path: str) -> str:
    """The artifact (hex SHA-256) the log at ``path`` names in its first record; "" when it names none."""
    with open(path, "rb") as handle:
        head = handle.read(HEADER.size + ARTIFACT_BYTES)
    if len(head) < HEADER.size + ARTIFACT_BYTES:
        return ""
    magic, _, _, crc = HEADER.unpack_from(head)
    payload = head[HEADER.size :]
    return payload.hex() if magic == ARTIFACT_MAGIC and zlib.crc32(payload) == crc else ""


class UpdateLog:
    """One stage's log; ``version`` counts the updates since the build (an update's answer), ``touched``
    the rows per table a snapshot keeps."""

    def __init__(
        self,
        path: str,
        tables: Sequence[torch.Tensor],
        compact_bytes: int = COMPACT_BYTES,
        *,
        artifact: str = "",
    ) -> None:
        self.path, self.tables, self.compact_bytes, self.artifact = path, tables, compact_bytes, artifact
        self.touched: list[set[int]] = [set() for _ in tables]
        self.version = 0
        self.snapshot_bytes = 0  # the log's size after its last snapshot

    def replay(self, apply: Callable[..., object]) -> str | None:
        """Apply every logged update with ``apply(tables, table, row, values)``, then compact if due; a
        log of another artifact is set aside instead, and where it went is returned."""
        set_aside = self._set_aside_if_foreign()
        self.version, records = read(self.path)
        for record in records:
            apply(self.tables, *record)
            self._touch(record[0], record[1])
        self.compact_if_due()
        return set_aside

    def _set_aside_if_foreign(self) -> str | None:
        if not self.artifact or not os.path.exists(self.path):
            return None
        written_for = artifact_of(self.path)
        if written_for == self.artifact:
            return None
        aside = f"{self.path}.set-aside-{written_for[:12] or 'unknown'}-{int(time.time())}"
        os.replace(self.path, aside)
        fsync(os.path.dirname(self.path) or ".")
        return aside

    def append(self, table: torch.Tensor, row: torch.Tensor, values: torch.Tensor) -> None:
        """Log one validated update durably (before it is applied and acknowledged)."""
        append(self.path, table, row, values, first=encode_artifact(self.artifact))
        self._touch(table, row)
        self.version += 1

    def _touch(self, table: torch.Tensor, row: torch.Tensor) -> None:
        for t, r in zip(table.reshape(-1).tolist(), row.reshape(-1).tolist(), strict=True):
            self.touched[t].add(r)

    def compact_if_due(self) -> None:
        """Compact once the log has grown enough (after an update is in the tables)."""
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
        parts[:0] = [encode_artifact(self.artifact), _record(BASE_MAGIC, BASE.pack(self.version, len(parts)))]
        with (
            staged(self.path) as temporary,
            open(os.open(temporary, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as out,
        ):
            out.writelines(parts)
        self.snapshot_bytes = os.path.getsize(self.path)
