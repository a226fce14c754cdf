"""Reading back ``perf.measure.records.write_csv``'s file, for tests that check what a run wrote."""

from __future__ import annotations

import csv
from dataclasses import fields
from pathlib import Path

from perf.measure.records import Record

# How each ``Record`` field is read back from its CSV text: worked out once, not once per row
PARSE = {
    "str": str,
    "float": float,
    "int": lambda text: int(text or 0),
    "bool": lambda text: text == "True",
    "tuple[float, ...]": lambda text: tuple(float(a) for a in text.split()),
}
PARSERS = {f.name: PARSE[f.type] for f in fields(Record)}


def read_csv(path: Path) -> list[Record]:
    """The inverse of ``write_csv``."""
    with open(path, newline="") as handle:
        return [
            Record(**{name: parse(row.get(name) or "") for name, parse in PARSERS.items()})
            for row in csv.DictReader(handle)
        ]
