"""The Python backend's ``/dev/shm`` regions of one server are made owner-only (0600): the second layer.

Triton 2.51's Python backend creates them world-readable (0644, set explicitly through Boost, so a
umask alone does not help): any local user could map them and read every request tensor the stubs
see. ``server.shm_private`` keeps them 0600 from creation (fault matrix row 42); where it cannot (no C
compiler), this is what remains: the launcher tightens them once the server is ready and the fronts
tighten those of reloaded or restarted stubs within a second of their creation. Nothing the server
runs needs another user to open them (the server and its stubs run as one user).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

SHM_DIR = Path("/dev/shm")


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
