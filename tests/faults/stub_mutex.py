"""Stop a Python-backend stub at the moment it owns one of the Python backend's robust mutexes (fault
matrix row 25): a stop at a random moment rarely lands there, and only such a stop, once the stub is
killed, made tritonserver 2.51 abort (``server.stubs.owned_mutexes``). And the other way round: kill a
stub at a moment it owns none, for the rows about a stub's death that the watchdog heals (row 1)."""

from __future__ import annotations

import os
import signal
import time

from process_stop import stop_every_thread

from server.stubs import owned_mutexes


def stop_owning_a_mutex(pid: int, region: str, seconds: float) -> tuple[list[int], int]:
    """SIGSTOP the stub at a moment it owns a mutex, watched for up to ``seconds``; stopped anyway then.

    The region is read while the stub runs (a read costs about a millisecond and the stub never
    waits for it); when a mutex looks owned, the stub is stopped and the region read again, and if it
    was released meanwhile, resumed after a stop of a few ms that harms nothing. The watchdog seldom
    sees those stops. Returns (offsets of the mutexes it owns when left stopped, stops made); ([], n)
    when none was caught, or when the watchdog killed it during one of the short stops."""
    stops = 0
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            if not owned_mutexes(pid, region):
                continue
            stop_every_thread(pid)
            stops += 1
            held = owned_mutexes(pid, region)
            if held:
                return held, stops
            os.kill(pid, signal.SIGCONT)
        stop_every_thread(pid)
        return owned_mutexes(pid, region), stops + 1
    except ProcessLookupError:  # the watchdog saw one of the short stops and killed the stub
        return [], stops


def kill_owning_none(pid: int, region: str, seconds: float = 30.0) -> bool:
    """SIGKILL the stub at a moment it owns none of the Python backend's mutexes; whether this kill
    ended it (False: the watchdog saw one of the short stops first and killed it as hung).

    A ``kill -9`` that lands while the stub owns the pool mutex leaves it owner-died and 2.51 aborts at
    its next execute (docs/SERVING.md, "Triton 2.51's own limits"; the supervisor restarts the server):
    not what a test of the watchdog's healing asks about, and on a loaded host, where the stub is often
    preempted holding it, a random kill lands there often enough to fail a run. So the stub is stopped,
    its region read, and killed while still stopped; resumed for a millisecond when it owned one. After
    ``seconds`` it is killed whatever it owns."""
    deadline = time.monotonic() + seconds
    try:
        while True:
            stop_every_thread(pid)
            if not owned_mutexes(pid, region) or time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                return True
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.001)
    except ProcessLookupError:
        return False
