"""Fault matrix row 9: two ``python -m server start`` at once from one checkout, then a quick restart.

The second start must fail at once with a clear message (no traceback, nothing started, nothing
orphaned), the first must serve; ``stop`` then an immediate ``start`` on the same ports must work.
Runs the real CLI in its own folder (its own ``.run/``), on free ports.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from resilience_fixtures import build_small_repository, shm_regions, tree_environment

from server.proc_stat import running
from server.stubs import stubs_with_prefix
from tests.faults.harness import recorded_port_arguments, start_arguments

pytestmark = pytest.mark.integration
BUSY = "is starting a server from this checkout; wait for it, or `make stop`"


@pytest.fixture(scope="module")
def checkout(spec_data: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("checkout")
    build_small_repository(spec_data, folder / "model_repository", pipeline=False)
    (folder / "models.yaml").write_text(yaml.safe_dump(spec_data))  # `client infer` reads the spec
    return folder


def _cli(checkout: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", *args],
        cwd=checkout,
        env=tree_environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(process: subprocess.Popen, timeout: float = 240) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def test_second_start_fails_cleanly_and_quick_restart_works(checkout: Path) -> None:
    start = ("server", "start", *start_arguments())
    first, second = _cli(checkout, *start), _cli(checkout, *start)
    results = [_finish(first), _finish(second)]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 1], results
    loser = next(r for r in results if r[0] == 1)
    assert loser[2].startswith("error: another `python -m server start` (pid ") and BUSY in loser[2], loser
    assert "Traceback" not in loser[2] + results[0][2] + results[1][2]
    state = json.loads((checkout / ".run" / "server.json").read_text())
    assert running(state["pid"]) and running(state["supervisor_pid"])
    for protocol in ("http", "grpc"):
        health = _finish(_cli(checkout, "client", "--protocol", protocol, "health"))
        assert health[0] == 0 and "trivial: READY (serving version 1)" in health[1], health
    assert oct((checkout / ".run" / "admin.key").stat().st_mode & 0o777) == "0o600"
    same_ports = recorded_port_arguments(checkout)  # given, so the restart below cannot move off them

    stopped = _finish(_cli(checkout, "server", "stop"))
    assert stopped[0] == 0 and "drained: trivial" in stopped[1], stopped
    assert not running(state["pid"]) and not running(state["supervisor_pid"])
    assert stubs_with_prefix(state["shm_prefix"]) == [] and shm_regions(state["shm_prefix"]) == []

    again = _finish(_cli(checkout, "server", "start", *same_ports))  # at once, on the same ports
    assert again[0] == 0, again
    restarted = json.loads((checkout / ".run" / "server.json").read_text())
    assert [restarted[kind] for kind in ("http", "grpc", "metrics")] == [
        state[kind] for kind in ("http", "grpc", "metrics")
    ]
    assert _finish(_cli(checkout, "client", "infer", "--model", "trivial"))[0] == 0
    assert _finish(_cli(checkout, "server", "stop"))[0] == 0
    assert not running(restarted["pid"]) and stubs_with_prefix(restarted["shm_prefix"]) == []
    assert shm_regions(restarted["shm_prefix"]) == []
    assert not (checkout / ".run" / "server.json").exists()
