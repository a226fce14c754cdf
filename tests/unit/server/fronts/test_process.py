"""How long a front lives (fault matrix row 46): through a restart gap while its owner (the supervisor)
runs, following the server the pid file names; gone once neither runs. No server: ``sleep`` processes
play the owner and the servers."""

from __future__ import annotations

import argparse
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from server.fronts.process import _still_needed, current_server_pid


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen]]:
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        process.kill()
        process.wait()


def _sleeper(started: list[subprocess.Popen]) -> subprocess.Popen:
    started.append(subprocess.Popen(["sleep", "60"]))
    return started[-1]


def _stop(process: subprocess.Popen) -> None:
    process.kill()
    process.wait()


def test_a_front_outlives_its_server_while_its_owner_runs(tmp_path: Path, sleepers) -> None:
    owner, server = _sleeper(sleepers), _sleeper(sleepers)
    pid_file = tmp_path / "tritonserver.pid"
    pid_file.write_text(f"{server.pid}\n")
    args = argparse.Namespace(owner_pid=owner.pid, server_pid_file=pid_file)
    assert current_server_pid(pid_file) == server.pid
    _stop(server)
    assert _still_needed(args), "a restart gap: the supervisor runs"
    restarted = _sleeper(sleepers)
    pid_file.write_text(f"{restarted.pid}\n")
    _stop(owner)
    assert _still_needed(args), "released: the supervisor is gone, the server it left runs"
    _stop(restarted)
    assert not _still_needed(args), "neither runs: nothing will answer again"


def test_a_front_without_owner_or_server_runs_until_sigterm(tmp_path: Path) -> None:
    assert _still_needed(argparse.Namespace(owner_pid=None, server_pid_file=None))
    assert current_server_pid(tmp_path / "missing") is None
