"""The ledger of a client's region in the invariant fuzz: which bytes an answered request may have
changed, and every other change reported as a range (invariant (b): kept)."""

from __future__ import annotations

from pathlib import Path

from soak.fuzz_regions import ClientFile


def test_only_changes_outside_the_allowed_ranges_count(tmp_path: Path) -> None:
    region = ClientFile(tmp_path / "r", "a", bytearray(b"abcdefghij"))
    assert region.changed_outside(b"abcdefghij") == []
    assert region.changed_outside(b"aXcdefgYYj") == [(1, 2), (7, 9)]
    region.allowed.append((6, 9))
    assert region.changed_outside(b"aXcdefgYYj") == [(1, 2)]
    assert region.changed_outside(b"abc") == [(3, 10)]
