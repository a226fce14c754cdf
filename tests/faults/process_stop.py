"""Stopping a process with SIGSTOP, seen done: every one of its threads stopped.

``kill`` returns once the signal is queued; each thread stops when it next runs, which on a loaded
host may be a while. A test that reads a stopped process's memory, or sends a stopped server a
request it must not read, waits for ``/proc`` to show every thread stopped instead of sleeping.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from server.proc_stat import EXITED, stat_fields
from server.stubs import STOPPED_STATES

STOP_GUARD_S = 10.0  # a hang guard: how long a SIGSTOP may take to reach every thread


def stop_every_thread(pid: int) -> None:
    """SIGSTOP ``pid`` and return once every thread of it is stopped (``/proc`` state ``T``): until
    then a thread can still run (take or release a mutex, read and answer a request), so what a test
    reads of the process sooner can be stale at once.
    On an idle host that is microseconds; a loaded one may not run a thread for a while to stop it.
    ``ProcessLookupError`` once the process is gone."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + STOP_GUARD_S
    while not _every_thread_stopped(pid):
        assert time.monotonic() < deadline, f"SIGSTOP did not stop every thread of {pid} in {STOP_GUARD_S} s"
        time.sleep(0.0005)


def _every_thread_stopped(pid: int) -> bool:
    """Whether no thread of ``pid`` can run; ``ProcessLookupError`` once the process has exited (a
    zombie too: someone else killed it, and a kill of ours now would end nothing)."""
    process = stat_fields(pid)
    if process is None or process[0] in EXITED:
        raise ProcessLookupError(pid)
    try:
        threads = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        raise ProcessLookupError(pid) from None
    states = [fields[0] for thread in threads if (fields := stat_fields(thread / "stat")) is not None]
    return all(state in STOPPED_STATES + EXITED for state in states)  # a thread may exit on its own
