"""Fault matrix row: tritonserver itself dies under ``make serve``.

``kill -9`` of the tritonserver that ``python -m server start`` launched: its supervisor must remove
the dead server's ``/dev/shm`` regions and stray stubs, restart it on the same ports (the HTTP front
forwarding to it again), report the restart and its cause in ``server status`` and ``client health``,
and serve the embedding updates acknowledged before the kill. ``server stop`` then stops everything
(the supervisor first, so it restarts nothing). Runs the real CLI in its own folder (its own ``.run/``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from resilience_fixtures import (
    HANG_GUARD_S,
    acknowledged_updates,
    build_small_repository,
    pipeline_answer,
    process_alive,
    shm_regions,
    tree_environment,
    wait_for,
)

from server.stubs import server_stubs, stubs_with_prefix
from tests.faults.harness import start_arguments

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def checkout(spec_data: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("supervised_checkout")
    build_small_repository(spec_data, folder / "model_repository")
    (folder / "models.yaml").write_text(yaml.safe_dump(spec_data))
    return folder


def _cli(checkout: Path, *args: str, timeout: float = HANG_GUARD_S) -> tuple[int, str, str]:
    """``python -m <args>`` in ``checkout``, importing this tree's code (not another install's)."""
    done = subprocess.run(
        [sys.executable, "-m", *args],
        cwd=checkout,
        env=tree_environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return done.returncode, done.stdout, done.stderr


def _state(checkout: Path) -> dict:
    return json.loads((checkout / ".run" / "server.json").read_text())


def _restarted(checkout: Path, dead_pid: int) -> dict | None:
    """The recorded state once a new tritonserver serves every model, else None."""
    try:
        state = _state(checkout)
    except (OSError, ValueError):
        return None
    if state["pid"] == dead_pid or not process_alive(state["pid"]):
        return None
    code, _, _ = _cli(checkout, "client", "health", timeout=60)
    return state if code == 0 else None


def test_a_killed_server_is_restarted_on_its_ports_with_its_updates_and_nothing_left(checkout: Path) -> None:
    ports = start_arguments()
    code, out, err = _cli(checkout, "server", "start", *ports, "--model-control-mode=explicit")
    assert code == 0, (out, err)
    try:
        before = _state(checkout)
        expected = acknowledged_updates(before["http"])  # through the HTTP front
        dead_stubs = [s.pid for s in server_stubs(before["pid"]) if s.alive]
        dead_regions = shm_regions(before["shm_prefix"])
        assert dead_stubs and dead_regions
        os.kill(before["pid"], signal.SIGKILL)

        after = wait_for(lambda: _restarted(checkout, before["pid"]), "the killed server to be restarted")

        assert {k: after[k] for k in ("http", "grpc", "metrics")} == {
            k: before[k] for k in ("http", "grpc", "metrics")
        }
        assert not set(dead_regions) & set(shm_regions(before["shm_prefix"])), "the dead server's regions"
        assert not any(process_alive(pid) for pid in dead_stubs), "the dead server's stubs"
        http_answer = pipeline_answer(after["http"])
        grpc_answer = pipeline_answer(after["grpc"], "grpc")
        np.testing.assert_array_equal(http_answer, expected)
        np.testing.assert_array_equal(grpc_answer, expected)
        restarted = "tritonserver restarted 1 time(s); last death at "
        code, health, _ = _cli(checkout, "client", "health")
        assert code == 0 and restarted in health, health
        assert ": killed by SIGKILL; serving again after" in health, health
        code, status, _ = _cli(checkout, "server", "status")
        assert code == 0 and restarted in status, status
    finally:
        code, out, err = _cli(checkout, "server", "stop")
    assert code == 0 and "drained: " in out, (out, err)
    final = json.loads((checkout / ".run" / "supervisor.json").read_text())
    assert not process_alive(final["supervisor_pid"]) and not process_alive(final["server_pid"])
    assert stubs_with_prefix(before["shm_prefix"]) == [] and shm_regions(before["shm_prefix"]) == []
