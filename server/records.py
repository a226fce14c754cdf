"""The JSON records ``make serve`` keeps in ``.run/`` (server state, the watchdog's and the supervisor's
record): written whole or not at all (a reader never sees half a file), read as {} when absent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_record(path: Path, data: Any) -> None:
    """Write ``data`` as JSON beside ``path``, then rename it over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(data, indent=2))
    temporary.replace(path)


def read_record(path: Path) -> dict:
    """The record at ``path``; {} if there is none (or it cannot be read)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
