"""Which robust process-shared mutexes a Python-backend stub owns, read from its ``/dev/shm`` region.

A locked robust glibc mutex holds its owner's thread id in its lock word and again 8 bytes on. A stub
killed while it owns the pool mutex leaves it owner-died, and tritonserver's next lock raises an
uncaught ``lock_exception``: the server aborts (fault matrix row 25). The watchdog reads this before it
kills a stopped stub.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

SCANNED_WORDS = 1 << 16  # the region's first 256 KiB: the pool's header and the IPC control are there
FUTEX_TID_MASK = 0x3FFFFFFF  # a locked robust mutex's lock word: owner thread id plus two flag bits


def owned_mutexes(pid: int, region: str) -> list[int]:
    """Offsets in ``/dev/shm/<region>`` of the robust mutexes that a thread of ``pid`` owns now;
    [] when the process or the region is gone. Only meaningful while ``pid`` is stopped."""
    try:
        tids = np.array([int(t) for t in os.listdir(f"/proc/{pid}/task")], dtype=np.uint32)
        words = np.fromfile(Path("/dev/shm", region), np.uint32, SCANNED_WORDS)
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return []
    if tids.size == 0 or words.size < 3:
        return []
    lock_words = words[:-2] & np.uint32(FUTEX_TID_MASK)
    near = np.flatnonzero((lock_words >= tids.min()) & (lock_words <= tids.max()))
    return [int(i) * 4 for i in near if lock_words[i] in tids and words[i + 2] == lock_words[i]]
