"""One reader of ``/proc/<pid>/stat``. Its second field is the command name in parentheses, which may
itself hold spaces and parentheses, so the fixed fields are those after the last ``)``."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

EXITED = ("Z", "X")  # a zombie (exited, not yet reaped by its parent) or a dead task
STOPPED_STATES = ("T", "t")  # stopped by a signal (SIGSTOP, SIGTSTP), or by a tracer


def read_proc(path: str | Path, size: int = 4096) -> bytes | None:
    """A ``/proc`` file of a few hundred bytes in one ``read``, without the buffered file object that
    ``Path.read_bytes`` builds (three times the CPU; the watchdog reads such files several hundred
    times a second); None once its process or thread is gone."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            return os.read(fd, size)
        finally:
            os.close(fd)
    except OSError:
        return None


def stat_fields(stat: int | Path) -> list[str] | None:
    """The fields after the command name of a pid's (or a thread's) ``stat``: ``[0]`` state, ``[1]``
    ppid, ``[11]`` and ``[12]`` utime and stime; None once it is gone."""
    data = read_proc(f"/proc/{stat}/stat" if isinstance(stat, int) else stat)
    if data is None:
        return None
    return data[data.rindex(b")") + 2 :].decode().split()


def running(pid: int | None, parent: int | None = None) -> bool:
    """Whether ``pid`` runs (an exited one not yet reaped does not), as a child of ``parent`` if given."""
    fields = stat_fields(pid) if pid is not None else None
    return fields is not None and fields[0] not in EXITED and (parent is None or int(fields[1]) == parent)


def stop(pid: int, wait_s: float) -> bool:
    """SIGSTOP ``pid``; whether every thread stopped within ``wait_s`` (each only when it next runs, and
    may take a mutex until then; a frozen one never does). ``ProcessLookupError`` once it is gone."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + wait_s
    while not _every_thread_stopped(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.0005)
    return True


def _every_thread_stopped(pid: int) -> bool:
    process = stat_fields(pid)
    if process is None or process[0] in EXITED:
        raise ProcessLookupError(pid)
    try:
        threads = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        raise ProcessLookupError(pid) from None
    states = [fields[0] for thread in threads if (fields := stat_fields(thread / "stat")) is not None]
    return all(state in STOPPED_STATES + EXITED for state in states)  # a thread may exit on its own
