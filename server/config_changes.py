"""Which served configs may have changed since a front last looked (docs/SERVING.md, row 79): Triton
never says, so whatever loads, unloads or starts a server appends the model's name (JSON; ``null``:
every model) to a file the launcher owns, once Triton answered; it only grows, so no line is missed."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
EVERY_MODEL = None  # the line a tritonserver start writes: every served config may have changed


@dataclass(frozen=True)
class Changed:
    """The models whose served config may have changed (``every``: all of them)."""

    models: frozenset[str] = frozenset()
    every: bool = False

    def __bool__(self) -> bool:
        return self.every or bool(self.models)

    def covers(self, model: str) -> bool:
        return self.every or model in self.models


def mark_changed(path: Path, model: str | None = EVERY_MODEL) -> None:
    """Append that ``model``'s served config (``EVERY_MODEL``: every one) may have changed. One
    ``O_APPEND`` write: concurrent writers (a front, ``python -m server load``) never interleave."""
    line = (json.dumps(model) + "\n").encode()
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(descriptor, line)
    finally:
        os.close(descriptor)


class ConfigChanges:
    """A front's view of the file: what was appended since it last looked."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._read_to = self._size()  # what was there before the front started concerns no config it has

    def mark(self, model: str) -> None:
        """``model`` was loaded or unloaded through this front: the other front learns it too."""
        try:
            mark_changed(self.path, model)
        except OSError as error:  # the server's folder is gone: it is stopping
            log.warning("the other front is not told that %s was loaded or unloaded: %s", model, error)

    def _size(self) -> int:
        try:
            return os.stat(self.path).st_size
        except OSError:  # not written yet: nothing changed since
            return 0

    def poll(self) -> Changed:
        """The models named since the last ``poll``; a line not yet whole waits for the next one."""
        size = self._size()
        if size < self._read_to:  # removed or written anew: what it named is lost, so trust nothing
            self._read_to = 0
            return Changed(every=True)
        if size == self._read_to:
            return Changed()
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self._read_to)
                appended = handle.read(size - self._read_to)
        except OSError:  # removed meanwhile (the server stopped): trust nothing held
            return Changed(every=True)
        whole = appended[: appended.rfind(b"\n") + 1]
        self._read_to += len(whole)
        try:
            names = [json.loads(line) for line in whole.splitlines() if line.strip()]
        except ValueError:  # not ours: trust nothing held rather than miss a change
            return Changed(every=True)
        models = frozenset(name for name in names if isinstance(name, str))
        return Changed(models, every=any(name is EVERY_MODEL for name in names))
