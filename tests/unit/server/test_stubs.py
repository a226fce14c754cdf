"""``server.stubs``: a Python-backend stub read from ``/proc``, by its argv as Triton starts it
(``triton_python_backend_stub <model file> <shm region> ... <instance name>``), here a real child
process started under that name; and which robust mutexes a process owns, read from a shared-memory
region laid out as glibc lays out a locked robust ``pthread_mutex_t`` (lock word and owner field hold
the TID)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from server import stubs
from server.proc_stat import stop
from server.stubs import (
    FUTEX_TID_MASK,
    Stub,
    StubScan,
    activity,
    kill_stray_stubs,
    owned_mutexes,
    server_stubs,
    stub_regions,
    stubs_with_prefix,
)


def _ours(pid: int) -> list[Stub]:
    """This process's children as stubs, the one started here alone (a zombie child of another test
    would be listed too: a zombie has no argv to tell it by)."""
    return [stub for stub in server_stubs(os.getpid()) if stub.pid == pid]


def stub_argv(tmp_path: Path, prefix: str) -> list[str]:
    """A stub's argv as Triton writes it, its model file a Python script that sleeps a minute."""
    model_file = tmp_path / "recommender" / "3" / "model.py"
    model_file.parent.mkdir(parents=True)
    model_file.write_text("import time\ntime.sleep(60)\n")
    argv = ["/opt/backends/python/triton_python_backend_stub", str(model_file), f"{prefix}region"]
    argv += ["1048576", "1048576", str(os.getpid()), "/opt/backends/python", "handle", "recommender_0_0"]
    return argv


def test_a_stub_is_found_by_its_server_and_its_region_then_killed_as_a_stray(tmp_path: Path) -> None:
    prefix = f"tbtest{uuid.uuid4().hex[:8]}_"
    stub = subprocess.Popen(stub_argv(tmp_path, prefix), executable=sys.executable)
    try:
        deadline = time.monotonic() + 10
        while not any(s.alive for s in _ours(stub.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)  # the child's argv is its own once it has exec'd
        (found,) = _ours(stub.pid)
        assert (found.pid, found.model, found.version, found.instance) == (
            stub.pid, "recommender", "3", "recommender_0_0"
        )  # fmt: skip
        assert found.alive and not found.stopped and found.shm_region == f"{prefix}region"
        assert stubs_with_prefix(prefix) == [stub.pid] and f"{prefix}region" in stub_regions()
        assert server_stubs(stub.pid) == [] and stubs_with_prefix(f"{prefix}other") == []
        kill_stray_stubs(prefix)
        deadline = time.monotonic() + 10
        while stubs_with_prefix(prefix) and time.monotonic() < deadline:
            time.sleep(0.05)
        (zombie,) = _ours(stub.pid)  # exited, not yet reaped: known by its pid alone
        assert not zombie.alive
    finally:
        stub.kill()
        stub.wait()
    assert _ours(stub.pid) == []


EXEC_ON_A_LINE = "import os, sys\nsys.stdin.readline()\nos.execv(sys.executable, sys.argv[1:])"


def _until(found: Callable[[], list[Stub]], alive: bool) -> list[Stub]:
    deadline = time.monotonic() + 10  # a hang guard: the child runs when the host lets it
    while [s.alive for s in found()] != [alive] and time.monotonic() < deadline:
        time.sleep(0.05)
    return found()


def test_a_repeated_scan_finds_a_child_once_it_has_become_a_stub(tmp_path: Path) -> None:
    """Triton forks, then the child execs the stub: a scan between the two sees the server's child as
    another program, and a later scan by the same ``StubScan`` must find the stub all the same."""
    argv = stub_argv(tmp_path, f"tbtest{uuid.uuid4().hex[:8]}_")
    child = subprocess.Popen([sys.executable, "-c", EXEC_ON_A_LINE, *argv], stdin=subprocess.PIPE)
    scan = StubScan(os.getpid())

    def found() -> list[Stub]:
        return [stub for stub in scan() if stub.pid == child.pid]

    try:
        assert found() == []  # not a stub yet
        assert child.stdin is not None
        child.stdin.write(b"\n")
        child.stdin.flush()
        (stub,) = _until(found, alive=True)
        assert (stub.model, stub.version, stub.instance) == ("recommender", "3", "recommender_0_0")
        child.kill()
        assert [s.alive for s in _until(found, alive=False)] == [False]  # a zombie until reaped
    finally:
        child.kill()
        child.wait()
    assert found() == []


TICKING = "import threading, time\ndef tick():\n    while True:\n        time.sleep(0.3)\n"
TICKING += "threading.Thread(target=tick).start()\nprint('ready', flush=True)\ntime.sleep(60)\n"


@pytest.mark.parametrize("reader", [stubs._schedstat_activity, stubs._stat_activity])
def test_activity_moves_while_a_thread_wakes_and_stands_still_while_stopped(
    monkeypatch: pytest.MonkeyPatch, reader: Callable[[str], int | None]
) -> None:
    """A stub's health thread wakes every 300 ms and uses next to no CPU (no tick of it may be
    counted): such a process must count as running; a stopped one must not (either reader)."""
    monkeypatch.setattr(stubs, "THREAD_ACTIVITY", reader)
    child = subprocess.Popen([sys.executable, "-c", TICKING], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"  # started: idle from now
        first, deadline = activity(child.pid), time.monotonic() + 10  # a hang guard
        while activity(child.pid) == first and time.monotonic() < deadline:
            time.sleep(0.05)
        assert activity(child.pid) != first
        assert stop(child.pid, 10.0)
        counts = []
        for _ in range(5):  # a thread marked stopped may still be switched out once more
            counts.append(activity(child.pid))
            time.sleep(0.3)
        assert counts[-1] == counts[-2] and counts[-1] is not None
    finally:
        child.kill()
        child.wait()
    assert activity(child.pid) is None


@pytest.fixture
def region() -> Iterator[str]:
    name = f"test_stubs_{uuid.uuid4().hex}"
    yield name
    Path("/dev/shm", name).unlink(missing_ok=True)


def write_region(name: str, words: dict[int, int]) -> None:
    data = np.zeros(1 << 12, np.uint32)
    for offset, value in words.items():
        data[offset // 4] = value
    data.tofile(Path("/dev/shm", name))


def test_a_mutex_locked_by_one_of_the_threads_is_owned(region: str) -> None:
    tid = threading.get_native_id()
    write_region(region, {184: tid | 0x80000000, 192: tid})  # waiters bit set: still the owner
    assert owned_mutexes(os.getpid(), region) == [184]


def test_a_word_that_only_looks_like_a_thread_id_is_not_a_mutex(region: str) -> None:
    tid = threading.get_native_id()
    write_region(region, {184: tid, 192: 7, 4000: 1})  # an owner field that disagrees
    assert owned_mutexes(os.getpid(), region) == []


def test_a_mutex_of_another_process_or_a_missing_region_is_not_owned(region: str) -> None:
    other = 1 if os.getpid() != 1 else 2
    write_region(region, {184: other & FUTEX_TID_MASK, 192: other})
    assert owned_mutexes(os.getpid(), region) == []
    assert owned_mutexes(os.getpid(), region + "_gone") == []
