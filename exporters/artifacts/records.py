"""The JSON records a build keeps beside its artifacts, written whole; a missing or damaged one means
"rebuild", never a crash."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from exporters.artifacts.file_hash import file_matches
from python_backend.atomic_files import write_text

log = logging.getLogger(__name__)


def read_record(path: Path) -> dict[str, Any] | None:
    """The record at ``path``, or None (logged) when it is missing, unreadable or not a JSON object."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        log.warning("%s: unreadable build record (%s); rebuilding", path, error)
        return None
    if not isinstance(data, dict):
        log.warning("%s: not a build record (a JSON %s); rebuilding", path, type(data).__name__)
        return None
    return data


def current_record(path: Path, artifact: Path, digest: str) -> dict[str, Any] | None:
    """The record at ``path`` of an identical export (``digest``) whose ``artifact`` is still that file."""
    record = read_record(path)
    if record is None or record.get("content_hash") != digest:
        return None
    return record if file_matches(artifact, record.get("file_sha256")) else None


def write_record(path: Path, data: dict[str, Any]) -> None:
    """Write the record atomically (a reader sees the old record or the new one)."""
    write_text(path, json.dumps(data, indent=2))
