"""Fault matrix row 25, at its worst moment: the embedding stub stopped while it owns the Python
backend's pool mutex, under load.

Killed there, the stub leaves that robust mutex owner-died, and tritonserver 2.51 aborts
(``boost::interprocess::lock_exception``) at its next execute on that instance, a few seconds later,
while the model reloads. A stop at a random moment rarely lands there (0 aborts in 20 such stops here),
so this test watches the running stub's region and stops it at a moment it owns the mutex
(``stub_mutex.stop_owning_a_mutex``), and leaves it stopped. The watchdog must let it release the
mutex before it kills it: the server stays up and the pipeline serves again. Without that, the server
aborted after each such stop in our trials.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from resilience_fixtures import (
    EMBEDDING,
    PIPELINE,
    MixedLoad,
    build_small_repository,
    explicit_options,
    process_alive,
    stub_of,
)
from stub_mutex import stop_owning_a_mutex

from server import TritonServer
from server.records import read_record
from server.stubs import server_stubs

pytestmark = pytest.mark.integration

ROUNDS = 1  # stops that land while the stub owns the pool mutex; each aborted 2.51 without the fix
MAX_STOPS = 3  # stops tried in all (one may land owning nothing: the watchdog was quicker, or no moment came)
WATCH_S = 15.0  # how long one stop waits for the stub to own a mutex
HEAL_GUARD_S = 90.0  # a hang guard for one reload, not a bound on it


@pytest.fixture(scope="module")
def server(spec_data: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    repository = build_small_repository(spec_data, tmp_path_factory.mktemp("stub_mutex_repository"))
    with TritonServer(explicit_options(repository, tmp_path_factory.mktemp("stub_mutex_workdir"))) as running:
        yield running


def wait_healed_or_dead(server: TritonServer, stopped_pid: int) -> None:
    """Until the stopped stub is gone, a new one serves the model and the watchdog marks nothing
    unavailable, or the server has died."""
    deadline = time.monotonic() + HEAL_GUARD_S
    while time.monotonic() < deadline and server.process.poll() is None:
        live = [s for s in server_stubs(server.pid) if s.alive and s.model == EMBEDDING]
        fresh = [s for s in live if s.pid != stopped_pid and s.instance != EMBEDDING]
        stopped_gone = not any(s.pid == stopped_pid for s in live)
        if stopped_gone and fresh and not read_record(server.watchdog_path).get("unavailable_now"):
            return
        time.sleep(0.05)
    assert server.process.poll() is not None, f"{EMBEDDING} not healed in {HEAL_GUARD_S} s"


def test_a_stub_stopped_owning_the_pool_mutex_is_killed_without_aborting_the_server(
    server: TritonServer,
) -> None:
    load = MixedLoad(server.http_url, server.grpc_url, ["trivial", PIPELINE], callers_per=2).start()
    owned_at_stop = []
    try:
        load.wait_for(20)
        for _ in range(MAX_STOPS):
            stub = stub_of(server.pid, EMBEDDING)
            held, _ = stop_owning_a_mutex(stub.pid, stub.shm_region, seconds=WATCH_S)
            wait_healed_or_dead(server, stub.pid)
            assert server.process.poll() is None, f"stopped owning {held}; " + server.log_tail()
            assert not process_alive(stub.pid), "the stopped stub was left to resume"
            if held:
                owned_at_stop.append(held)
            if len(owned_at_stop) == ROUNDS:
                break
        served_again = time.monotonic()
        # the pipeline's own answers: under load the other model's alone could fill any count first
        load.wait_for(5, HEAL_GUARD_S, lambda o: o.model == PIPELINE and o.sent > served_again)
    finally:
        load.stop()
    assert server.process.poll() is None, server.log_tail()
    assert load.hung() == 0
    if not owned_at_stop:  # about one run in three here: the server survived, but the case was not met
        pytest.skip(f"none of {MAX_STOPS} stops landed while the stub owned the pool mutex")
