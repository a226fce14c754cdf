"""``server.proc_stat.stop``: a SIGSTOP is done only once every thread of the process is stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from server.proc_stat import STOPPED_STATES, stat_fields, stop

# a process of 16 threads, each running whenever it gets the CPU
BUSY = """
import threading
def spin():
    while True:
        pass
for _ in range(15):
    threading.Thread(target=spin, daemon=True).start()
print("ready", flush=True)
spin()
"""


def _thread_states(pid: int) -> list[str]:
    tasks = Path(f"/proc/{pid}/task").iterdir()
    return [fields[0] for task in tasks if (fields := stat_fields(task / "stat")) is not None]


def test_stop_returns_once_every_thread_is_stopped() -> None:
    """``kill`` returns once SIGSTOP is queued; each thread stops when it next runs. The watchdog reads a
    stub's mutexes right after, so a thread still running could take one in between."""
    busy = subprocess.Popen([sys.executable, "-c", BUSY], stdout=subprocess.PIPE, text=True)
    try:
        assert busy.stdout is not None and busy.stdout.readline() == "ready\n"
        for _ in range(20):
            assert stop(busy.pid, 10.0)
            states = _thread_states(busy.pid)
            assert len(states) == 16 and all(state in STOPPED_STATES for state in states), states
            os.kill(busy.pid, signal.SIGCONT)
    finally:
        busy.kill()
        busy.wait()


def test_a_process_that_is_gone_or_a_zombie_cannot_be_stopped() -> None:
    """A zombie holds its pid until it is reaped, but a stop (or the kill that follows it) ends nothing."""
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    while (fields := stat_fields(exited.pid)) is not None and fields[0] not in ("Z", "X"):
        os.sched_yield()
    with pytest.raises(ProcessLookupError):
        stop(exited.pid, 1.0)
    exited.wait()
    with pytest.raises(ProcessLookupError):
        stop(exited.pid, 1.0)
