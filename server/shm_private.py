"""The Python backend's ``/dev/shm`` regions are 0600 from the moment they exist (fault matrix row 42):
2.51 ``fchmod``s them 0644 and a descriptor opened before a later chmod outlives it, so tritonserver
runs with umask 077 and ``shm_private.c`` preloaded; without a compiler, ``make_owner_only`` once ready."""

from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess
from pathlib import Path

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("shm_private.c")
SERVER_UMASK = 0o077
LIBRARY_NAME = "shm_private.so"
SHM_DIR = Path("/dev/shm")


def build_library(folder: Path) -> Path | None:
    """``folder/shm_private.so``, compiled if missing or stale; None (and a warning) without a compiler."""
    library = folder / LIBRARY_NAME
    if library.exists() and library.stat().st_mtime >= SOURCE.stat().st_mtime:
        return library
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        log.warning(
            "no C compiler: the Python backend's /dev/shm regions are 0644 until the server is ready "
            "(another local user may open one then); install gcc (server/shm_private.c)"
        )
        return None
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f".{LIBRARY_NAME}.{os.getpid()}"
    done = subprocess.run(
        [compiler, "-shared", "-fPIC", "-O2", "-o", str(partial), str(SOURCE), "-ldl"],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        log.warning("could not build %s (regions tightened only once ready): %s", SOURCE, done.stderr[-500:])
        return None
    partial.replace(library)
    return library


def preload_environment(folder: Path, environment: dict[str, str]) -> dict[str, str]:
    """``environment`` with the library on ``LD_PRELOAD`` (ahead of anything already there)."""
    library = build_library(folder)
    if library is None:
        return environment
    preload = " ".join(filter(None, [str(library), environment.get("LD_PRELOAD", "")]))
    return {**environment, "LD_PRELOAD": preload}


def make_owner_only(prefix: str, directory: Path = SHM_DIR) -> list[str]:
    """chmod 0600 every ``prefix*`` region others may read or write; returns the names it changed."""
    changed = []
    for region in directory.glob(f"{prefix}*") if prefix else ():
        try:
            mode = region.lstat().st_mode
            if stat.S_ISREG(mode) and mode & 0o077:
                os.chmod(region, 0o600)
                changed.append(region.name)
        except OSError:  # gone meanwhile (a stub exited)
            continue
    return changed
