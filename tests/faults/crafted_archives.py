"""``.pt2`` archives that show Python's ``zipfile`` and torch's zip reader (miniz) different entries.

A valid program's entries are rewritten by a small zip writer of our own (stored entries, plain end
record) so each construction controls every header byte. Each hostile construction also carries the
legacy ``data/weights/model.pt`` entry holding a pickle that runs ``touch <marker>``: if any reader
that loads the archive sees that entry, torch unpickles it.

``two_central_directories`` is the one that passed the old check: the end record's directory offset
points miniz at a directory listing the legacy entry, while ``zipfile`` (which takes the directory to
end where the end record starts, and shifts every offset by the difference) reads a clean directory
laid just after it. The others are the usual ways readers part: prepended bytes, bytes between
entries, a local header naming another entry than its directory record, a name listed twice, a
zip64 end record disagreeing with the plain one, bytes after the end record.
"""

from __future__ import annotations

import random
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from crafted_programs import code_pickle

LEGACY_WEIGHTS = "data/weights/model.pt"
CONSTRUCTIONS = ("two_central_directories", "prepended_bytes", "hidden_local_entry",
                 "renamed_local_header", "duplicate_name", "zip64_disagrees", "trailing_bytes",
                 "appended_second_archive")  # fmt: skip


@dataclass
class Record:
    """One stored entry: its name, bytes, and where its local header went."""

    name: str
    data: bytes
    offset: int = 0
    extra: bytes = b""


def _local(record: Record, name: str | None = None) -> bytes:
    raw = (name or record.name).encode()
    crc, size = zlib.crc32(record.data), len(record.data)
    header = struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0x800, 0, 0, 0x21, crc, size, size, len(raw), 0)
    return header + raw + record.data


def _central(record: Record, offset: int | None = None) -> bytes:
    raw = record.name.encode()
    crc, size = zlib.crc32(record.data), len(record.data)
    where = record.offset if offset is None else offset
    header = struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 20, 20, 0x800, 0, 0, 0x21, crc, size, size,
                         len(raw), len(record.extra), 0, 0, 0, 0, where)  # fmt: skip
    return header + raw + record.extra


def _end(count: int, size: int, offset: int) -> bytes:
    return struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, count, count, size, offset, 0)


def _zip64_end(count: int, size: int, offset: int, at: int) -> bytes:
    record = struct.pack("<4sQHHIIQQQQ", b"PK\x06\x06", 44, 45, 45, 0, 0, count, count, size, offset)
    return record + struct.pack("<4sIQI", b"PK\x06\x07", 0, at, 1)


def program_records(valid: Path) -> list[Record]:
    with zipfile.ZipFile(valid) as archive:
        return [Record(i.filename, archive.read(i.filename)) for i in archive.infolist()]


def write_archive(records: list[Record]) -> bytes:
    """A plain archive of ``records`` as our own writer lays it out (which the loader accepts)."""
    body = b""
    for record in records:
        record.offset = len(body)
        body += _local(record)
    directory = b"".join(_central(r) for r in records)
    return body + directory + _end(len(records), len(directory), len(body))


def _two_central_directories(records: list[Record], evil: Record) -> bytes:
    """miniz reads the directory at the end record's offset (listing ``evil`` in place of a harmless
    entry); ``zipfile`` reads the one that ends at the end record, with offsets shifted by the gap."""
    swapped = next(r for r in records if r.name.endswith("/byteorder"))
    evil_directory_size = sum(len(_central(evil if r is swapped else r)) for r in records)
    body = _local(evil)
    body += b"\0" * max(0, evil_directory_size - len(body))  # zipfile's offsets are shifted down by it
    evil.offset = 0
    for record in records:
        record.offset = len(body)
        body += _local(record)
    evil_directory = b"".join(_central(evil if r is swapped else r) for r in records)
    padding = len(evil.name) - len(swapped.name) - 4
    swapped.extra = b"\xfe\xca" + struct.pack("<H", padding) + b"\0" * padding
    shift = len(evil_directory)
    clean_directory = b"".join(_central(r, r.offset - shift) for r in records)
    assert len(clean_directory) == len(evil_directory)
    return body + evil_directory + clean_directory + _end(len(records), len(clean_directory), len(body))


def hostile_archive(construction: str, valid: Path, marker: Path) -> bytes:
    """``valid``'s entries, arranged the ``construction`` way, with a pickle that touches ``marker``."""
    records = program_records(valid)
    top = records[0].name.split("/", 1)[0]
    evil = Record(f"{top}/{LEGACY_WEIGHTS}", code_pickle(marker))
    if construction == "two_central_directories":
        return _two_central_directories(records, evil)
    if construction == "prepended_bytes":
        return _local(evil) + write_archive(records)  # zipfile shifts offsets past unknown leading bytes
    if construction == "appended_second_archive":
        return write_archive(records) + write_archive([*program_records(valid), evil])
    if construction == "trailing_bytes":
        return write_archive([*records, evil]) + b"\0" * 7
    if construction == "hidden_local_entry":
        clean = write_archive(records)
        directory_at = struct.unpack_from("<I", clean, len(clean) - 6)[0]
        hidden = _local(evil)
        directory = b"".join(_central(r, r.offset) for r in records)
        end = _end(len(records), len(directory), directory_at + len(hidden))
        return clean[:directory_at] + hidden + directory + end
    if construction == "renamed_local_header":
        data = write_archive([*records, evil])
        evil_at = evil.offset
        local = _local(Record(f"{top}/data/weights/model.pX", evil.data))
        return data[:evil_at] + local + data[evil_at + len(local) :]
    if construction == "duplicate_name":
        twin = Record(records[2].name, evil.data)
        return write_archive([*records, twin])
    if construction == "zip64_disagrees":
        data = write_archive([*records, evil])
        count, size, offset = struct.unpack_from("<HII", data, len(data) - 12)
        zip64 = _zip64_end(count - 1, size - len(_central(evil)), offset, len(data) - 22)
        return data[:-22] + zip64 + data[-22:]  # the plain record lists the legacy entry, zip64 does not
    raise ValueError(construction)


def mutations(seed: int, data: bytes, count: int) -> list[bytes]:
    """``count`` seeded mutations of ``data``: byte flips (often in the headers), inserted, deleted and
    repeated spans, and shifted directory offsets: most break the layout, a few keep it."""
    chooser = random.Random(seed)
    signatures = [i for i in range(len(data) - 4) if data[i : i + 2] == b"PK"]
    mutated = []
    for _ in range(count):
        copy = bytearray(data)
        for _ in range(chooser.randint(1, 3)):
            kind = chooser.choice(("flip", "flip_header", "insert", "delete", "repeat", "truncate"))
            at = chooser.randrange(len(copy))
            if kind == "flip":
                copy[at] ^= 1 << chooser.randrange(8)
            elif kind == "flip_header" and signatures:
                header = chooser.choice(signatures)
                spot = min(header + chooser.randrange(46), len(copy) - 1)
                copy[spot] = chooser.randrange(256)
            elif kind == "insert":
                copy[at:at] = bytes(chooser.randrange(256) for _ in range(chooser.randint(1, 64)))
            elif kind == "delete":
                del copy[at : at + chooser.randint(1, 64)]
            elif kind == "repeat":
                span = bytes(copy[at : at + chooser.randint(1, 512)])
                where = chooser.randrange(len(copy))
                copy[where:where] = span
            else:
                del copy[chooser.randrange(len(copy) // 2, len(copy)) :]
        mutated.append(bytes(copy))
    return mutated
