"""Fault matrix row: the pod's readiness probe tells the truth about hung stubs and
dead servers.

The image's entry point (``python -m server.container``, the cpu overlay's container) supervises
tritonserver and answers the probes the manifests use (``/ready``, ``/live`` on ``--probe-port``).
A stopped (SIGSTOP) stub must make ``/ready`` 503 naming its model until the watchdog has killed it
and reloaded the model (Triton's own ``/v2/health/ready`` says 200 all along); a ``kill -9`` of
tritonserver must make it 503 until the supervisor has restarted the server on the same ports, with
the restart and its cause in the probe's body and the acknowledged embedding updates served again;
``/live`` stays 200 throughout. SIGTERM then stops everything, leaving no stub or ``/dev/shm`` region.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from resilience_fixtures import (
    EMBEDDING,
    HANG_GUARD_S,
    acknowledged_updates,
    build_small_repository,
    pipeline_answer,
    shm_regions,
    stub_of,
    tree_environment,
    wait_for,
)

from server.ports import free_ports
from server.proc_stat import stat_fields
from server.stubs import stubs_with_prefix

pytestmark = pytest.mark.integration


@dataclass
class Container:
    process: subprocess.Popen  # the container's main process: the supervisor
    http_url: str
    probe_port: int
    shm_prefix: str
    log_path: Path

    def probe(self, path: str) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.probe_port}{path}", timeout=5) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())
        except OSError as error:
            return 0, {"error": str(error)}

    def check(self) -> None:
        assert self.process.poll() is None, self.log_path.read_text()[-3000:]

    def triton_pid(self) -> int | None:
        for proc in Path("/proc").iterdir():
            try:
                mine = proc.name.isdigit() and _parent(proc) == self.process.pid
                if mine and b"tritonserver" in (proc / "cmdline").read_bytes():
                    return int(proc.name)
            except OSError:
                continue
        return None


def _parent(proc: Path) -> int:
    fields = stat_fields(proc / "stat")
    if fields is None:
        raise OSError(f"{proc} is gone")
    return int(fields[1])


def _ready_becomes(container: Container, status: int) -> dict:
    """``/ready``'s body once it answers ``status``."""

    def answered() -> dict | None:
        code, body = container.probe("/ready")
        return body if code == status else None

    return wait_for(answered, f"/ready to answer {status}", container.check)


@pytest.fixture(scope="module")
def container(spec_data: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Container]:
    repository = build_small_repository(spec_data, tmp_path_factory.mktemp("container_repository"))
    workdir = tmp_path_factory.mktemp("container_workdir")
    ports = dict(zip(("http", "grpc", "metrics", "probe"), free_ports(["127.0.0.1"] * 4), strict=True))
    command = [
        sys.executable,
        "-m",
        "server.container",
        "--repository",
        str(repository),
        "--host",
        "127.0.0.1",
    ]
    command += [f"--{name}-port={port}" for name, port in ports.items()]
    command += ["--exit-timeout", "3", "--workdir", str(workdir / "w")]
    log_path = workdir / "container.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=tree_environment())
    running = Container(
        process, f"127.0.0.1:{ports['http']}", ports["probe"], f"tb{process.pid}_{ports['http']}_", log_path
    )
    try:
        wait_for(lambda: running.probe("/ready")[0] == 200, "the container to be ready", running.check)
        yield running
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def test_the_probes_report_a_hung_stub_and_a_dead_server_until_they_are_healed(container: Container) -> None:
    expected = acknowledged_updates(container.http_url)
    triton = container.triton_pid()
    assert triton is not None

    stub = stub_of(triton, EMBEDDING)
    os.kill(stub.pid, signal.SIGSTOP)
    hung = _ready_becomes(container, 503)
    assert EMBEDDING in hung["why"] and "hung (stopped, state T)" in hung["why"], hung
    assert container.probe("/live")[0] == 200
    _ready_becomes(container, 200)
    assert container.triton_pid() == triton, "the hung stub cost the server"

    os.kill(triton, signal.SIGKILL)
    _ready_becomes(container, 503)
    assert container.probe("/live")[0] == 200
    ready = _ready_becomes(container, 200)
    assert ready["supervisor"]["restarts"] == 1 and ready["supervisor"]["last_cause"] == "killed by SIGKILL"
    assert container.triton_pid() not in (None, triton)
    answer = pipeline_answer(container.http_url)
    np.testing.assert_array_equal(answer, expected)

    container.process.send_signal(signal.SIGTERM)
    assert container.process.wait(timeout=HANG_GUARD_S) == 0
    assert stubs_with_prefix(container.shm_prefix) == [] and shm_regions(container.shm_prefix) == []
