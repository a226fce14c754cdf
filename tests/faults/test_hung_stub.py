"""Fault matrix row: a Python-backend stub that hangs instead of dying.

``kill -STOP`` of the pipeline's embedding stage under load: Triton 2.51 answers every request to it
``Stub process ... is not healthy`` while every readiness endpoint says READY, and once the stub is
resumed (``kill -CONT``, as an unlucky operator would) tritonserver aborts. The watchdog must see the
stopped stub, report its model NOT SERVING in ``client health``, kill the stub before it can resume
and reload the model: the server stays up, the other model never fails, the pipeline serves again
with its acknowledged embedding updates, and nothing is left behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from harness import orphans
from resilience_fixtures import (
    EMBEDDING,
    PIPELINE,
    MixedLoad,
    acknowledged_updates,
    client_health,
    pipeline_answer,
    process_alive,
    shm_regions,
    small_server,
    stub_of,
    wait_for,
)

from server import TritonServer
from server.records import read_record
from server.stubs import server_stubs

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(spec_data: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    with small_server(spec_data, tmp_path_factory, "hung_stub") as running:
        yield running


def test_a_stopped_stub_is_reported_killed_and_reloaded_and_its_resume_harms_nothing(
    server: TritonServer,
) -> None:
    expected = acknowledged_updates(server.http_url)
    stub = stub_of(server.pid, EMBEDDING)
    load = MixedLoad(server.http_url, server.grpc_url, ["trivial", PIPELINE]).start()
    try:
        load.wait_for(40)
        stopped_at = time.monotonic()
        os.kill(stub.pid, signal.SIGSTOP)

        # The watchdog's record first, so that the one `client health` check begins inside the outage
        # (a reload can be over in a few seconds on a quiet machine; polling could miss it entirely).
        wait_for(
            lambda: EMBEDDING in read_record(server.watchdog_path).get("unavailable_now", {}),
            "the watchdog to record the stopped stub",
        )
        code, report = client_health(server, EMBEDDING)
        with contextlib.suppress(ProcessLookupError):
            os.kill(stub.pid, signal.SIGCONT)  # the unlucky operator: on 2.51 this aborted the server
        wait_for(
            lambda: load.ok(lambda o: o.model == PIPELINE and o.sent > stopped_at),
            "the pipeline to serve again",
        )
        load.wait_for(len(load.ok()) + 60)  # the abort came a second or so after SIGCONT
    finally:
        load.stop()
    assert server.process is not None and server.process.poll() is None, server.log_tail()
    assert code == 1, report
    assert f"{EMBEDDING}: NOT SERVING: stub of {EMBEDDING}_0_0 hung (stopped, state T)" in report, report
    assert not process_alive(stub.pid), "the stopped stub was left to resume"
    failures = [o for o in load.outcomes if o.error]
    assert all(f.model == PIPELINE for f in failures), [f.error for f in failures if f.model != PIPELINE]
    unhealthy = f"Stub process '{EMBEDDING}_0_0' is not healthy."
    assert all(unhealthy in f.error for f in failures), {f.error for f in failures}
    answer = pipeline_answer(server.http_url)
    np.testing.assert_array_equal(answer, expected)
    code, text = client_health(server)
    assert code == 0, text
    killed = f"watchdog: stub of {EMBEDDING}_0_0 (pid {stub.pid}) hung (stopped, state T), killed at"
    assert killed in text and "reloaded in" in text, text
    assert stub.shm_region not in shm_regions(server.shm_prefix)
    assert [s for s in server_stubs(server.pid) if s.pid == stub.pid and s.alive] == []
    assert not orphans(server), orphans(server)
    assert not any(caller.is_alive() for caller in load.callers), "a request never came back"
