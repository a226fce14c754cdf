"""Stop a Python-backend stub at the moment it owns one of the Python backend's robust mutexes (fault
matrix row 25): a stop at a random moment rarely lands there, and only such a stop, once the stub is
killed, made tritonserver 2.51 abort (``server.stub_locks``)."""

from __future__ import annotations

import os
import random
import signal
import time

from server.stub_locks import owned_mutexes


def stop_owning_a_mutex(pid: int, region: str, tries: int) -> tuple[list[int], int]:
    """SIGSTOP the stub; while it owns no mutex, resume it and try again a moment later (up to
    ``tries``): a stop of a few ms harms nothing, and the stub runs most of the time between tries, so
    the watchdog seldom sees it stopped first. Returns (offsets of the mutexes it owns, tries used);
    the stub is left stopped (or the watchdog has killed it: ([], tries))."""
    attempt = 0
    try:
        for attempt in range(1, tries + 1):
            os.kill(pid, signal.SIGSTOP)
            held = owned_mutexes(pid, region)
            if held:
                return held, attempt
            if attempt < tries:
                os.kill(pid, signal.SIGCONT)
                time.sleep(0.1 * random.random())
    except ProcessLookupError:  # the watchdog saw one of the short stops and killed the stub
        pass
    return [], attempt
