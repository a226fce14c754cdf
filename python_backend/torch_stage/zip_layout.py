"""The entries of a ``.pt2`` archive as torch's own zip reader sees them, and proof no other reader differs.

A zip archive can be read two ways: from its central directory (Python's ``zipfile``, and miniz inside
``torch._C.PyTorchFileReader``, each with its own leniencies) or by walking the local headers. A crafted
archive (duplicate names, prepended bytes, a second central directory, local headers that disagree with
the central one, bytes between entries, zip64 records that disagree with the plain ones) shows each
reader a different archive, so a check that reads one of them proves nothing about what another loads;
and ``torch.export.load`` falls back to ``zipfile`` when its own reader fails.

``read_entries`` accepts only the layout ``torch.export.save`` writes, byte for byte accounted for:
local header + data (+ data descriptor) for each entry, back to back from offset 0, then the central
directory listing the same entries in the same order at the same offsets with the same names, sizes and
CRCs, then an optional zip64 end record and locator, then the end record, with no comment and nothing
after it. Entries are stored (not compressed), each name once. It then requires ``zipfile``'s listing
and torch's reader's listing to be exactly that one, and returns each entry's bytes as torch's reader
returns them (checked equal to the bytes the walk found). Standard library and torch only: copied
beside each stage's model.py.
"""

from __future__ import annotations

import io
import struct
import zipfile
import zlib
from dataclasses import dataclass

import torch

LOCAL = struct.Struct("<4sHHHHHIIIHH")  # signature .. name length, extra length
CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")  # signature .. external attributes, local header offset
END = struct.Struct("<4sHHHHIIH")
END64 = struct.Struct("<4sQHHIIQQQQ")
LOCATOR64 = struct.Struct("<4sIQI")
DESCRIPTOR_SIGNATURE = b"PK\x07\x08"
DATA_DESCRIPTOR_FLAG = 0x08
UTF8_FLAG = 0x800
MAX_ENTRIES = 100_000


class ZipLayoutError(ValueError):
    """The archive is not laid out the one way ``torch.export.save`` lays it out."""


@dataclass(frozen=True)
class Entry:
    """One entry as the central directory lists it, and where its stored bytes lie."""

    name: str
    header_offset: int
    size: int
    crc: int
    flags: int


def _unpack(layout: struct.Struct, data: bytes, offset: int, what: str) -> tuple:
    if offset < 0 or offset + layout.size > len(data):
        raise ZipLayoutError(f"{what} at byte {offset} runs past the end of the archive")
    return layout.unpack_from(data, offset)


def _end_of_central_directory(data: bytes) -> tuple[int, int, int, int]:
    """``(entries, directory offset, directory size, where the directory must end)`` from the end
    records; the plain end record must be the archive's last bytes (no comment)."""
    end_at = len(data) - END.size
    fields = _unpack(END, data, end_at, "end record")
    signature, disk, cd_disk, here, total, cd_size, cd_offset, comment = fields
    if signature != b"PK\x05\x06" or comment or disk or cd_disk or here != total:
        raise ZipLayoutError("the archive does not end with one plain end-of-central-directory record")
    cd_end = end_at
    locator_at = end_at - LOCATOR64.size
    if locator_at >= 0 and data[locator_at : locator_at + 4] == b"PK\x06\x07":
        _, disk64, end64_at, disks = _unpack(LOCATOR64, data, locator_at, "zip64 locator")
        record_at = locator_at - END64.size
        if disk64 or disks != 1 or end64_at != record_at:
            raise ZipLayoutError("the zip64 locator does not point at the record just before it")
        fields = _unpack(END64, data, record_at, "zip64 end record")
        signature, record_size, _, _, disk, cd_disk, here64, total64, cd_size64, cd_offset64 = fields
        plain_record = signature == b"PK\x06\x06" and record_size == END64.size - 12
        if not plain_record or disk or cd_disk or here64 != total64:
            raise ZipLayoutError("the zip64 end record is not a plain one")
        for plain, wide, what in ((total, total64, "entry count"), (cd_size, cd_size64, "directory size"),
                                  (cd_offset, cd_offset64, "directory offset")):  # fmt: skip
            if plain != wide and plain not in (0xFFFF, 0xFFFFFFFF):
                raise ZipLayoutError(f"the zip64 and plain end records disagree on the {what}")
        total, cd_size, cd_offset, cd_end = total64, cd_size64, cd_offset64, record_at
    if cd_offset + cd_size != cd_end or total > MAX_ENTRIES:
        raise ZipLayoutError("bytes lie between the central directory and the end records")
    return total, cd_offset, cd_size, cd_end


def _zip64_sizes(extra: bytes, size: int, compressed: int, offset: int) -> tuple[int, int, int]:
    """The sizes and offset with a zip64 extra field's values put in for their 0xFFFFFFFF markers."""
    position = 0
    while position + 4 <= len(extra):
        kind, length = struct.unpack_from("<HH", extra, position)
        body = extra[position + 4 : position + 4 + length]
        if kind == 1:
            values = list(struct.unpack_from(f"<{len(body) // 8}Q", body))
            wanted = [size, compressed, offset].count(0xFFFFFFFF)
            if len(values) < wanted:
                raise ZipLayoutError("a zip64 extra field lacks the sizes its entry defers to it")
            if size == 0xFFFFFFFF:
                size = values.pop(0)
            if compressed == 0xFFFFFFFF:
                compressed = values.pop(0)
            if offset == 0xFFFFFFFF:
                offset = values.pop(0)
        position += 4 + length
    if position != len(extra):
        raise ZipLayoutError("an extra field runs past its length")
    return size, compressed, offset


def _name(raw: bytes, flags: int) -> str:
    try:
        return raw.decode("utf-8" if flags & UTF8_FLAG else "cp437")
    except UnicodeDecodeError as error:
        raise ZipLayoutError(f"entry name {raw[:80]!r} is not valid UTF-8") from error


def _central_directory(data: bytes, total: int, cd_offset: int, cd_end: int) -> list[Entry]:
    entries, position, seen = [], cd_offset, set()
    for _ in range(total):
        fields = _unpack(CENTRAL, data, position, "central directory header")
        (signature, _, _, flags, method, _, _, crc, compressed, size, name_length, extra_length,
         comment_length, disk, _, _, offset) = fields  # fmt: skip
        name_at = position + CENTRAL.size
        raw_name = data[name_at : name_at + name_length]
        extra = data[name_at + name_length : name_at + name_length + extra_length]
        size, compressed, offset = _zip64_sizes(extra, size, compressed, offset)
        if signature != b"PK\x01\x02" or method != 0 or compressed != size or comment_length or disk:
            raise ZipLayoutError(f"central directory entry {raw_name[:80]!r} is not a plain stored entry")
        name = _name(raw_name, flags)
        if name in seen:
            raise ZipLayoutError(f"entry {name!r} is listed twice")
        seen.add(name)
        entries.append(Entry(name, offset, size, crc, flags))
        position = name_at + name_length + extra_length + comment_length
    if position != cd_end:
        raise ZipLayoutError("the central directory holds more than its entries")
    return entries


def _walk_local_headers(data: bytes, entries: list[Entry], cd_offset: int) -> dict[str, bytes]:
    """Each entry's stored bytes, found by walking the local headers from byte 0: every one where the
    central directory says, agreeing with it, and nothing between them or before the directory."""
    stored, position = {}, 0
    for entry in entries:
        if entry.header_offset != position:
            raise ZipLayoutError(
                f"entry {entry.name!r} is not where the previous one ends (bytes outside entries)"
            )
        fields = _unpack(LOCAL, data, position, f"local header of {entry.name!r}")
        signature, _, flags, method, _, _, crc, compressed, size, name_length, extra_length = fields
        name_at = position + LOCAL.size
        raw_name = data[name_at : name_at + name_length]
        extra = data[name_at + name_length : name_at + name_length + extra_length]
        if signature != b"PK\x03\x04" or method != 0 or flags != entry.flags:
            raise ZipLayoutError(f"the local header of {entry.name!r} disagrees with the central directory")
        if _name(raw_name, flags) != entry.name:
            raise ZipLayoutError(
                f"the local header at byte {position} names {raw_name[:80]!r}, not {entry.name!r}"
            )
        size, compressed, _ = _zip64_sizes(extra, size, compressed, 0)
        start = name_at + name_length + extra_length
        content = data[start : start + entry.size]
        if len(content) != entry.size or zlib.crc32(content) != entry.crc:
            raise ZipLayoutError(f"the bytes of {entry.name!r} do not match the central directory's CRC")
        position = start + entry.size
        if flags & DATA_DESCRIPTOR_FLAG:
            position = _skip_descriptor(data, position, entry)
        elif (crc, compressed, size) != (entry.crc, entry.size, entry.size):
            raise ZipLayoutError(f"the local header of {entry.name!r} disagrees with the central directory")
        stored[entry.name] = content
    if position != cd_offset:
        raise ZipLayoutError("bytes lie between the last entry and the central directory")
    return stored


def _skip_descriptor(data: bytes, position: int, entry: Entry) -> int:
    """Past the data descriptor after ``entry``'s bytes, which must repeat the directory's CRC and sizes."""
    if data[position : position + 4] == DESCRIPTOR_SIGNATURE:
        position += 4
    for layout in (struct.Struct("<IQQ"), struct.Struct("<III")):
        if position + layout.size <= len(data) and layout.unpack_from(data, position) == (
            entry.crc, entry.size, entry.size,
        ):  # fmt: skip
            return position + layout.size
    raise ZipLayoutError(f"the data descriptor of {entry.name!r} disagrees with the central directory")


def _zipfile_listing(data: bytes) -> list[tuple[str, int, int]]:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            return [(i.filename, i.header_offset, i.file_size) for i in archive.infolist()]
    except Exception as error:  # zipfile raises many kinds on a malformed archive
        raise ZipLayoutError(f"Python's zip reader refuses it ({error})") from error


def read_entries(data: bytes) -> dict[str, bytes]:
    """Every entry's bytes by its full name, as torch's reader returns them; raises ``ZipLayoutError``
    unless the raw layout, ``zipfile`` and torch's reader all see exactly the same entries."""
    total, cd_offset, _, cd_end = _end_of_central_directory(data)
    entries = _central_directory(data, total, cd_offset, cd_end)
    stored = _walk_local_headers(data, entries, cd_offset)
    walked = [(e.name, e.header_offset, e.size) for e in entries]
    if _zipfile_listing(data) != walked:
        raise ZipLayoutError("Python's zip reader lists other entries than the archive's headers hold")
    top = entries[0].name.split("/", 1)[0] + "/" if entries else ""
    try:
        reader = torch._C.PyTorchFileReader(io.BytesIO(data))
        records = reader.get_all_records()
        if sorted(top + r for r in records) != sorted(stored):
            raise ZipLayoutError("torch's zip reader lists other entries than the archive's headers hold")
        read = {top + r: reader.get_record(r) for r in records}
    except RuntimeError as error:
        raise ZipLayoutError(
            f"torch's zip reader refuses it ({' '.join(str(error).split())[:200]})"
        ) from error
    if read != stored:
        raise ZipLayoutError("torch's zip reader reads other bytes than the archive's headers hold")
    return read
