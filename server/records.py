"""The JSON records ``make serve`` keeps in ``.run/``: written whole or not at all, {} when absent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from python_backend.atomic_files import write_text


def write_record(path: Path, data: Any) -> None:
    """Write ``data`` as JSON over ``path``: a reader sees the old record or the new one."""
    write_text(path, json.dumps(data, indent=2))


def read_record(path: Path) -> dict:
    """The record at ``path``; {} if there is none or it cannot be read."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
