"""The JSON records a build keeps beside its artifacts, written whole, and the hashes of the files they
vouch for: a missing or damaged record means "rebuild", never a crash, and a cache hit means "this exact
file", not "a file by that name" (a truncated ``model.onnx`` with an intact record would otherwise be
"cached" and fail only in the server)."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from python_backend.atomic_files import copy_file, write_text

log = logging.getLogger(__name__)
EXPORT_FILES = ("model.onnx", "export.json")  # an ONNX export: the file served and its record


def file_sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def file_matches(path: Path, expected: str | None) -> bool:
    """True when ``path`` exists and hashes to ``expected``; logs why a recorded artifact is rebuilt."""
    if not path.is_file():
        return False
    if not expected:
        log.warning("%s: no file hash recorded (older build); rebuilding it", path)
        return False
    actual = file_sha256(path)
    if actual != expected:
        log.warning(
            "%s: file changed since it was built (sha256 %s, recorded %s); rebuilding it",
            path, actual[:12], expected[:12],
        )  # fmt: skip
        return False
    return True


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


def lend_export(twin: Path, out_dir: Path, digest: str) -> None:
    """Copy the export in folder ``twin`` into ``out_dir`` unless that holds it (``digest``) already; the
    copy is checked as any earlier export, so it can save work but never change a result."""
    model, record = (out_dir / name for name in EXPORT_FILES)
    if current_record(record, model, digest) is None:
        for name in EXPORT_FILES:
            copy_file(twin / name, out_dir / name)


def write_record(path: Path, data: dict[str, Any]) -> None:
    """Write the record atomically (a reader sees the old record or the new one)."""
    write_text(path, json.dumps(data, indent=2))
