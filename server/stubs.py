"""The Python backend's stub processes of one server, read from ``/proc``, and the mutexes they own.

A stub's argv is ``triton_python_backend_stub <model file> <shm region> <shm size> <growth> <parent pid>
<backend dir> <ipc handle> <instance name> ...``. A live stub is hung when none of its threads runs
(stopped, or frozen): a healthy one's health thread wakes every 300 ms, so ``activity`` keeps moving.

A locked robust glibc mutex holds its owner's thread id in its lock word and again 8 bytes on. A stub
killed while it owns the pool mutex in its ``/dev/shm`` region leaves it owner-died, and tritonserver's
next lock raises an uncaught ``lock_exception``: the server aborts (fault matrix row 25). The watchdog
reads ``owned_mutexes`` before it kills a stopped stub.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from server.proc_stat import EXITED, STOPPED_STATES, read_proc, stat_fields

STUB_NAME = b"triton_python_backend_stub"
SCANNED_WORDS = 1 << 16  # a region's first 256 KiB: the pool's header and the IPC control are there
ARGV_BYTES = 1 << 16  # room for a stub's argv: its paths and names
FUTEX_TID_MASK = 0x3FFFFFFF  # a locked robust mutex's lock word: owner thread id plus two flag bits


@dataclass(frozen=True)
class Stub:
    pid: int
    model: str
    version: str
    instance: str
    shm_region: str
    alive: bool
    state: str = ""  # the /proc state letter when read: R, S, D, T, t, ...

    @property
    def stopped(self) -> bool:
        return self.state in STOPPED_STATES


def _stub_from_proc(pid: int, state: str) -> Stub | None:
    """The stub of ``pid`` (in ``state``, from its ``stat``), or None if it is another program."""
    argv = read_proc(f"/proc/{pid}/cmdline", ARGV_BYTES)
    if argv is None:
        return None
    argv = argv.split(b"\0")
    if state in EXITED or not argv[0]:
        return Stub(pid, "", "", "", "", alive=False, state=state)  # a zombie has no argv; matched by pid
    if not argv[0].endswith(STUB_NAME) or len(argv) < 9:
        return None
    version = Path(argv[1].decode(errors="replace")).parent
    instance, region = argv[8].decode(errors="replace"), argv[2].decode(errors="replace")
    return Stub(pid, version.parent.name, version.name, instance, region, alive=True, state=state)


def _schedstat_activity(task: str) -> int | None:
    """A thread's time on a CPU (ns) plus the times it was given one: one small file."""
    counts = read_proc(f"{task}/schedstat")
    if counts is None:
        return None
    on_cpu_ns, _, timeslices = counts.split()
    return int(on_cpu_ns) + int(timeslices)


def _stat_activity(task: str) -> int | None:
    """A thread's CPU ticks plus context switches, for a kernel whose ``schedstat`` counts nothing."""
    fields, status = stat_fields(Path(task, "stat")), read_proc(f"{task}/status")
    if fields is None or status is None:
        return None
    switches = sum(int(line.split()[1]) for line in status.splitlines() if b"ctxt_switches" in line)
    return int(fields[11]) + int(fields[12]) + switches  # utime, stime (fields 14 and 15 of stat)


def _schedstat_counts() -> bool:
    """Whether ``schedstat`` counts here: a kernel without sched_info has no file or writes zeros, and
    this thread has been given a CPU at least once."""
    counts = read_proc("/proc/thread-self/schedstat")
    return counts is not None and int(counts.split()[2]) > 0


THREAD_ACTIVITY = _schedstat_activity if _schedstat_counts() else _stat_activity


def activity(pid: int) -> int | None:
    """What the threads of ``pid`` have run, summed: it stays the same only while no thread runs. None
    once the process is gone."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    counts = (THREAD_ACTIVITY(f"/proc/{pid}/task/{tid}") for tid in tids)
    return sum(count for count in counts if count is not None)  # None: a thread that has just exited


class StubScan:
    """The stub children of ``parent`` (any: None), live or not yet reaped, read anew at each call.
    Another's child stays another's while it lives (an orphan goes to init or a subreaper), so a repeated
    scan (the watchdog's, four a second) skips the pids it saw to be others' until they leave ``/proc``."""

    def __init__(self, parent: int | None) -> None:
        self.parent = parent
        self._others: set[int] = set()

    def __call__(self) -> list[Stub]:
        pids = [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
        self._others.intersection_update(pids)
        stubs = []
        for pid in pids:
            fields = None if pid in self._others else stat_fields(pid)
            if fields is None:
                continue
            if self.parent is not None and int(fields[1]) != self.parent:
                self._others.add(pid)
            elif (stub := _stub_from_proc(pid, fields[0])) is not None:
                stubs.append(stub)
        return stubs


def server_stubs(parent: int | None) -> list[Stub]:
    """The stub processes that are children of ``parent`` (any: None), live or not yet reaped."""
    return StubScan(parent)()


def stubs_with_prefix(prefix: str) -> list[int]:
    """Live stubs (any parent, orphans included) whose shared-memory region starts with ``prefix``."""
    return [stub.pid for stub in server_stubs(None) if stub.alive and stub.shm_region.startswith(prefix)]


def stub_regions() -> set[str]:
    """The ``/dev/shm`` regions of every live stub on this host: no client may register one
    (``server.fronts.client_regions``)."""
    return {stub.shm_region for stub in server_stubs(None) if stub.alive}


def kill_stray_stubs(prefix: str) -> None:
    """SIGKILL stubs whose region starts with ``prefix``: orphans of a killed server live on otherwise."""
    for pid in stubs_with_prefix(prefix):
        with contextlib.suppress(OSError):  # exited meanwhile
            os.kill(pid, signal.SIGKILL)


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
