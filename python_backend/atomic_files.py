"""Files that readers see whole or not at all (a build rewrites folders a live server reads), and one
clear error when the disk is full. Each is written under a hidden temporary name, fsynced and renamed
over its final name; a killed writer's temporary is swept by the next write there. Standard library only."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

PARTIAL = ".partial-"
FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _size(count: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024


def free_bytes(path: Path) -> int:
    """Free bytes on the file system that holds ``path`` (or its nearest existing parent)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


class DiskFullError(OSError):
    """A file could not be written whole: its file system has no room for it."""

    def __init__(self, path: Path, needed: int, exact: bool) -> None:
        self.path, self.needed, self.free = Path(path), needed, free_bytes(path)
        need = f"it needs {_size(needed)}" if exact else f"it needs more than {_size(needed)}"
        message = f"no space left to write {path}: {_size(self.free)} free on its file system, {need}"
        super().__init__(errno.ENOSPC, message, str(path))

    def __str__(self) -> str:
        return str(self.strerror)


def explain(error: OSError) -> str:
    """One line for an ``OSError`` of a build: the disk-full form (with the free space) where it is one."""
    if isinstance(error, DiskFullError) or error.errno not in FULL or not error.filename:
        return str(error)
    return f"no space left to write {error.filename}: {_size(free_bytes(Path(error.filename)))} free"


def _sweep(folder: Path) -> None:
    """Remove the temporaries of writers that died (their process is gone)."""
    for leftover in folder.glob(f"{PARTIAL}*"):
        pid = leftover.name.removeprefix(PARTIAL).split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not os.path.exists(f"/proc/{pid}"):
            with contextlib.suppress(OSError):
                leftover.unlink()


def fsync(path: Path | str) -> None:
    """fsync a file, or a folder to make a rename in it durable."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


@contextlib.contextmanager
def staged(path: Path, size: int | None = None) -> Iterator[Path]:
    """``with staged(final) as temporary:`` write ``temporary`` any way; a clean exit replaces ``final``
    whole, a failure leaves it as it was. ``size``: the bytes it will take, for the disk-full message."""
    path = Path(path)
    temporary = path.parent / f"{PARTIAL}{os.getpid()}-{secrets.token_hex(4)}.{path.name}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _sweep(path.parent)
        yield temporary
        fsync(temporary)
        os.replace(temporary, path)
        fsync(path.parent)
    except OSError as error:
        if error.errno not in FULL or isinstance(error, DiskFullError):
            raise
        written = temporary.stat().st_size if temporary.exists() else 0
        temporary.unlink(missing_ok=True)
        raise DiskFullError(path, size if size is not None else written, exact=size is not None) from error
    finally:
        temporary.unlink(missing_ok=True)


def write_bytes(path: Path, data: bytes) -> None:
    with staged(path, len(data)) as temporary, open(temporary, "wb") as handle:
        handle.write(data)


def write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode())


def copy_file(source: Path, destination: Path) -> None:
    """Copy ``source`` (with its mode) to ``destination`` whole or not at all."""
    with staged(destination, Path(source).stat().st_size) as temporary:
        shutil.copy2(source, temporary)
