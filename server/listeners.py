"""Whether the sockets listening on a server's ports are its own (the kernel's socket tables).

tritonserver binds its OS-picked ports only once its models load; another process may take one
meanwhile and answer the readiness probe in its place. Without ``/proc`` tables, the probe is trusted.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable

from server.fronts.peer import TABLES  # the kernel's socket tables, as the fronts read them

LISTEN = "0A"  # the state column of a listening socket


def listening_inodes() -> dict[int, set[str]]:
    """The inodes of the sockets listening on each port (any address), from one read of the tables."""
    inodes: dict[int, set[str]] = {}
    for table in TABLES:
        with contextlib.suppress(OSError):
            for line in table.read_text().splitlines()[1:]:
                fields = line.split()  # sl, local address:port, remote, state, ..., inode (10th)
                if len(fields) > 9 and fields[3] == LISTEN:
                    inodes.setdefault(int(fields[1].rsplit(":", 1)[1], 16), set()).add(fields[9])
    return inodes


def socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets process ``pid`` holds ({} when it is gone)."""
    found: set[str] = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    found.add(link[len("socket:[") : -1])
    return found


def held_by(ports: Iterable[int], pids: Iterable[int]) -> bool:
    """Whether something listens on each of ``ports`` and every such socket is one of ``pids``'."""
    if not any(table.exists() for table in TABLES):
        return True
    ours, listening = set().union(*(socket_inodes(pid) for pid in pids)), listening_inodes()
    return all((found := listening.get(port)) and found <= ours for port in ports)
