"""Fault matrix row 46: the fronts stay up while the supervisor restarts a tritonserver that died.

Before, each front exited with its tritonserver and the supervisor started new ones with the new
server: in the gap, clients got "connection refused" instead of the JSON 503 / gRPC ``UNAVAILABLE``
the fronts promise. Now a ``kill -9`` of tritonserver is answered 503 JSON over HTTP and
``UNAVAILABLE: tritonserver is not reachable …`` over gRPC by the same front processes until the
restarted server serves, and the fronts stop once the supervisor gives up.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient
from harness import PROTOCOLS, trivial_inputs, url
from resilience_fixtures import build_small_repository, explicit_options, process_alive, wait_for
from tritonclient.utils import InferenceServerException

from client.connection import connect
from server import TritonServer
from server.supervisor import GAVE_UP, RestartPolicy, Supervisor

pytestmark = pytest.mark.integration


def _http_ready(address: str) -> str:
    """One ``GET /v2/health/ready`` over a plain socket: ``"200"``, ``"503 json"``, ``"refused"``…"""
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
    except ConnectionRefusedError:
        return "refused"
    except OSError as error:
        return f"error {error}"
    status = answer.split(b" ", 2)[1].decode()
    if status != "200":
        try:
            json.loads(answer.partition(b"\r\n\r\n")[2])["error"]
            status += " json"
        except (ValueError, KeyError, TypeError):
            status += " not json"
    return status


def _grpc_ready(client: grpcclient.InferenceServerClient) -> str:
    try:
        return "ready" if client.is_server_ready() else "not ready"
    except InferenceServerException as error:
        if "tritonserver is not reachable" in (error.message() or ""):
            return "front: unavailable"  # the front answered
        return f"{error.status()}: {error.message()}"  # e.g. nobody listens: connection refused


class GapWatcher:
    """Polls both fronts every 20 ms from the moment of the kill, counting each kind of answer."""

    def __init__(self, server: TritonServer) -> None:
        self.server, self.seen = server, {"http": {}, "grpc": {}}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        grpc = grpcclient.InferenceServerClient(self.server.grpc_url)
        while not self.stop.is_set():
            answers = {"http": _http_ready(self.server.http_url), "grpc": _grpc_ready(grpc)}
            for protocol, answer in answers.items():
                self.seen[protocol][answer] = self.seen[protocol].get(answer, 0) + 1
            time.sleep(0.02)
        grpc.close()

    def __enter__(self) -> dict[str, dict[str, int]]:
        self.thread.start()
        return self.seen

    def __exit__(self, *exc_info: object) -> None:
        self.stop.set()
        self.thread.join(timeout=60)


def _serves(server: TritonServer, dead_pid: int) -> bool:
    if server.pid == dead_pid or server.process is None or server.process.poll() is not None:
        return False
    try:
        for protocol in PROTOCOLS:
            connect(protocol, url(server, protocol)).infer("trivial", trivial_inputs(protocol))
    except InferenceServerException:
        return False
    return True


def test_the_fronts_answer_through_a_restart_gap_and_stop_when_supervision_gives_up(
    spec_data: dict[str, Any], tmp_path: Path
) -> None:
    repository = build_small_repository(spec_data, tmp_path / "repository", pipeline=False)
    options = explicit_options(repository, tmp_path / "server")
    options.http_front = options.grpc_front = True
    server = TritonServer(options)
    # one restart allowed, 2 s after the death: a gap long enough to be seen from outside
    supervisor = Supervisor(server, tmp_path / "supervisor.json", RestartPolicy(first_delay_s=2.0, burst=1))
    supervisor.start()
    outcome: list[int] = []
    runner = threading.Thread(target=lambda: outcome.append(supervisor.run()), daemon=True)
    runner.start()
    try:
        fronts = [front.pid for front in server.fronts]
        assert len(fronts) == 2
        first = server.pid
        with GapWatcher(server) as seen:
            os.kill(first, signal.SIGKILL)
            wait_for(lambda: _serves(server, first), "the restarted server to serve through the fronts")
        assert [front.pid for front in server.running_fronts] == fronts, "the same fronts, still running"
        assert "refused" not in seen["http"] and seen["http"].get("503 json"), seen["http"]
        # 502: a request in flight at the kill, or on a kept-alive connection to the dead server
        assert set(seen["http"]) <= {"200", "502 json", "503 json"}, seen["http"]
        assert seen["grpc"].get("front: unavailable"), seen["grpc"]
        assert set(seen["grpc"]) <= {"ready", "not ready", "front: unavailable"}, seen["grpc"]

        os.kill(server.pid, signal.SIGKILL)  # the start limit is reached: supervision ends for good
        runner.join(timeout=120)
        assert outcome == [1] and supervisor.record.state == GAVE_UP
        assert not any(process_alive(pid) for pid in fronts), "the fronts stop with the supervision"
        assert _http_ready(server.http_url) == "refused"
    finally:
        supervisor.release()
        runner.join(timeout=120)
        server.stop()
