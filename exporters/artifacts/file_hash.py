"""The hash of an artifact file, so a cache hit means "this exact file", not "a file by that name": a
truncated ``model.onnx`` with an intact record would otherwise be "cached" and fail only in the server.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


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


def hash_files(files: list[Path], digest: Any) -> None:
    """Fold the names and bytes of ``files`` into ``digest`` (a hashlib object)."""
    for file in files:
        digest.update(file.name.encode())
        digest.update(file.read_bytes())
