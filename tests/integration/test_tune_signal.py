"""A tune killed with SIGTERM (``kill``, a CI timeout) stops its tritonserver before it exits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from server.proc_stat import stat_fields

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
START_GUARD_S = 240  # a hang guard: how long the tune may take to start its server and measure on it


def _children(pid: int) -> list[int]:
    entries = [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
    return [entry for entry in entries if (fields := stat_fields(entry)) and int(fields[1]) == pid]


def _tritonserver_under(pid: int) -> int | None:
    """The tritonserver among ``pid``'s descendants, if one runs."""
    pending = [pid]
    while pending:
        for child in _children(pending.pop()):
            try:
                if b"tritonserver" in Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")[0]:
                    return child
            except OSError:
                continue
            pending.append(child)
    return None


def _inferences(server: int) -> float:
    """Inferences ``server`` has counted so far, read from the metrics endpoint its argv names: more
    than none once the tune's probe measures. 0 while the endpoint does not answer yet."""
    try:
        argv = Path(f"/proc/{server}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return 0.0
    flags = dict(arg.split("=", 1) for arg in argv if arg.startswith("--metrics-") and "=" in arg)
    host = flags.get("--metrics-address", "127.0.0.1").replace("0.0.0.0", "127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://{host}:{flags['--metrics-port']}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except OSError:
        return 0.0
    counts = [line.rsplit(" ", 1)[1] for line in text.splitlines() if line.startswith("nv_inference_count{")]
    return sum(map(float, counts))


def test_sigterm_stops_the_tuners_server(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "perf", "tune", "--spec", str(ROOT / "models.yaml")]
    command += ["--model", "recommender", "--p99-ms", "10", "--engine", "ours", "--reports", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    tune = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline, server = time.monotonic() + START_GUARD_S, None
        while server is None and time.monotonic() < deadline and tune.poll() is None:
            time.sleep(0.5)
            server = _tritonserver_under(tune.pid)
        assert server is not None, tune.communicate(timeout=30)[0].decode()[-2000:]
        while not _inferences(server):  # SIGTERM while the probe measures
            assert tune.poll() is None, tune.communicate(timeout=30)[0].decode()[-2000:]
            assert time.monotonic() < deadline, "the tune's probe sent its server no inference"
            time.sleep(0.2)
        tune.send_signal(signal.SIGTERM)
        output = tune.communicate(timeout=120)[0].decode()
    finally:
        if tune.poll() is None:
            tune.kill()
    outlived = Path(f"/proc/{server}").exists()
    if outlived:  # leave no orphan behind for the tests after this one
        os.kill(server, signal.SIGKILL)
    assert not outlived, "tritonserver outlived the tune"
    assert tune.returncode == 130, output[-2000:]
    assert "interrupted; the server was stopped" in output
