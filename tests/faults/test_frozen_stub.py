"""Fault matrix row 72: a stub that gets no CPU for 1.5 s in the middle of its executes, under load.

Triton 2.51 gives a stub one second to show a sign of life while it runs an ``execute``; after that it
answers the batch ``Stub process '<instance>' is not healthy``, frees the batch's shared memory while
the stub still holds it, and dies (SIGSEGV, SIGABRT with ``lock_exception``, SIGBUS) once the stub
runs again. A starved host does that to a stub; so does a cgroup freezer, which this test uses to
take all CPU from the embedding stub for 1.5 s without stopping it (``/proc`` state stays S or D, never
T). The watchdog must take the silent stub for hung and kill it before it resumes: the server stays up
and the pipeline serves again. With the watchdog's former 2 s silence rule, tritonserver died in every
round of this here.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from resilience_fixtures import (
    EMBEDDING,
    PIPELINE,
    MixedLoad,
    process_alive,
    small_server,
    stub_of,
    wait_healed_or_dead,
)

from server import TritonServer

pytestmark = pytest.mark.integration

FREEZER = Path("/sys/fs/cgroup/freezer")  # cgroup v1; v2's freezer is cgroup.freeze in a child group
FREEZE_S = 1.5  # over Triton's one-second window, under the former 2 s silence rule
MAX_FREEZES = 5  # freezes of one stub in a round, until the watchdog kills it (or the server dies)
ROUNDS = 2
HEAL_GUARD_S = 90.0  # a hang guard for one reload, not a bound on it


@pytest.fixture(scope="module")
def freezer_group() -> Iterator[Path]:
    """A cgroup-v1 freezer group of this test's own; skips where there is none to create (not root, or
    no v1 freezer mounted)."""
    group = FREEZER / f"triton_batching_test_{os.getpid()}"
    try:
        group.mkdir()
    except OSError as error:
        pytest.skip(f"needs a cgroup-v1 freezer it may create a group in ({FREEZER}): {error.strerror}")
    try:
        yield group
    finally:
        (group / "freezer.state").write_text("THAWED")
        for task in (group / "tasks").read_text().split():
            with contextlib.suppress(OSError):  # exited meanwhile
                (FREEZER / "tasks").write_text(task)
        with contextlib.suppress(OSError):
            group.rmdir()


def freeze(group: Path, pid: int, seconds: float) -> None:
    """No thread of ``pid`` runs for ``seconds`` (what a starved CPU does to it); then it may run again.
    A SIGKILL sent meanwhile ends it at the thaw, before it runs any code of its own."""
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):  # a thread that has just exited
            (group / "tasks").write_text(task)
    (group / "freezer.state").write_text("FROZEN")
    time.sleep(seconds)
    (group / "freezer.state").write_text("THAWED")


@pytest.fixture(scope="module")
def server(spec_data: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    with small_server(spec_data, tmp_path_factory, "frozen_stub") as running:
        yield running


def test_a_stub_frozen_past_tritons_health_window_is_killed_before_it_resumes(
    freezer_group: Path, server: TritonServer
) -> None:
    load = MixedLoad(server.http_url, server.grpc_url, ["trivial", PIPELINE], callers_per=2).start()
    try:
        load.wait_for(20)
        for _ in range(ROUNDS):
            stub = stub_of(server.pid, EMBEDDING)
            for _ in range(MAX_FREEZES):
                freeze(freezer_group, stub.pid, FREEZE_S)
                time.sleep(1.0)  # the thawed stub runs again; Triton dies here if it gave up on it
                if server.process.poll() is not None or not process_alive(stub.pid):
                    break
            assert server.process.poll() is None, server.log_tail()
            assert not process_alive(stub.pid), f"the stub was frozen {MAX_FREEZES} times and never killed"
            wait_healed_or_dead(server, stub.pid, HEAL_GUARD_S)
            assert server.process.poll() is None, server.log_tail()
        served_again = time.monotonic()
        # the pipeline's own answers: under load the other model's alone could fill any count first
        load.wait_for(5, HEAL_GUARD_S, lambda o: o.model == PIPELINE and o.sent > served_again)
    finally:
        load.stop()
    assert server.process.poll() is None, server.log_tail()
    assert not any(caller.is_alive() for caller in load.callers), "a request never came back"
    # only the frozen stub's model may fail
    assert [o for o in load.outcomes if o.error and o.model == "trivial"] == []
