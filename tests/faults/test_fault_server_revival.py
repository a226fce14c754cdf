"""The shared fault server's revival (``harness.revive``): a tritonserver that dies during a fault test
is started again, with its fronts, for the tests after it, and the death is reported with its cause.

Its own small server (``trivial`` behind both fronts, as the shared one runs): killing the shared one
would fail the test it died in, which is the point of ``server_survives``.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from harness import assert_live_and_ready, revive
from resilience_fixtures import build_small_repository

from server import ServerOptions, TritonServer

pytestmark = pytest.mark.integration

EXIT_GUARD_S = 30.0  # a hang guard for the killed server's exit, not a bound on it


@pytest.fixture(scope="module")
def server(spec_data: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    folder = tmp_path_factory.mktemp("revival_repository")
    repository = build_small_repository(spec_data, folder, pipeline=False)
    options = ServerOptions(repository=repository, startup_timeout_s=240, http_front=True, grpc_front=True)
    with TritonServer(options) as running:
        yield running


def test_a_running_server_is_left_alone(server: TritonServer) -> None:
    pid = server.pid
    assert revive(server) is None
    assert server.pid == pid


def test_a_dead_server_is_started_again_and_its_death_named(server: TritonServer) -> None:
    dead_pid = server.pid
    os.kill(dead_pid, signal.SIGKILL)
    deadline = time.monotonic() + EXIT_GUARD_S
    while server.process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    cause = revive(server)
    assert cause is not None and "SIGKILL" in cause, cause
    assert server.pid != dead_pid and server.process.poll() is None
    assert_live_and_ready(server)  # through the same fronts, on the same ports
    assert revive(server) is None
