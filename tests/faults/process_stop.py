"""Stopping a process with SIGSTOP, seen done: every one of its threads stopped (``server.proc_stat.stop``).

A test that reads a stopped process's memory, or sends a stopped server a request it must not read,
waits for ``/proc`` to show every thread stopped instead of sleeping.
"""

from __future__ import annotations

from server.proc_stat import stop

STOP_GUARD_S = 10.0  # a hang guard: how long a SIGSTOP may take to reach every thread


def stop_every_thread(pid: int) -> None:
    """SIGSTOP ``pid`` and return once every thread of it is stopped; ``ProcessLookupError`` once it is
    gone."""
    assert stop(pid, STOP_GUARD_S), f"SIGSTOP did not stop every thread of {pid} in {STOP_GUARD_S} s"
