"""``python -m server``'s own messages (the serving itself is tested against real servers)."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import pytest

from server.__main__ import STATE, _already_running, _status, _stop
from server.records import write_record


def test_a_second_server_in_one_checkout_is_one_line_with_the_holder_and_the_fix() -> None:
    state = {"pid": 4321, "supervisor_pid": 4300, "http": "127.0.0.1:8000", "grpc": "127.0.0.1:8001",
             "repository": "/x/model_repository"}  # fmt: skip
    line = _already_running(state)
    assert "\n" not in line and "pid 4321" in line and "127.0.0.1:8000" in line and "`make stop`" in line


# how Triton 2.51 ends its log when it exits 1 at its exit timeout holding two model versions
EXIT_TIMEOUT_LOG = """Signal (15) received.
I1206 server.cc:336] "All models are stopped, unloading models"
I1206 server.cc:345] "Timeout 3: Found 2 live models and 0 in-flight non-inference requests"
I1206 server.cc:345] "Timeout 0: Found 2 live models and 0 in-flight non-inference requests"
E1206 main.cc:535] "failed to stop server: Internal - Exit timeout expired. Exiting immediately."
"""
QUIET_EXIT_LOG = """Signal (15) received.
I1206 server.cc:345] "Timeout 30: Found 0 live models and 0 in-flight non-inference requests"
"""
EXPLAINED = "tritonserver exited with status 1: its exit timeout expired with 2 model version(s)"
EXITS_AT_SIGTERM = """import signal, sys, time
def stop(*_):
    with open(sys.argv[1], "a") as log:
        log.write(sys.argv[2])
    sys.exit(int(sys.argv[3]))
signal.signal(signal.SIGTERM, stop)
open(sys.argv[4], "w").close()
while True:
    time.sleep(0.05)
"""


@pytest.mark.parametrize(
    ("last_words", "status", "said"),
    [
        (EXIT_TIMEOUT_LOG, 1, EXPLAINED),
        (QUIET_EXIT_LOG, 0, None),
    ],
    ids=["exit timeout", "clean exit"],
)
def test_stop_says_when_tritonserver_exited_1_at_its_exit_timeout_and_why(
    last_words: str,
    status: int,
    said: str | None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``make stop`` does not parent tritonserver (the released supervisor did), so its exit status is
    lost; Triton's log says it. A stand-in named tritonserver writes Triton's last words at SIGTERM."""
    monkeypatch.chdir(tmp_path)
    log, started = tmp_path / "server.log", tmp_path / "started"
    log.write_text("I1206 model_lifecycle.cc:839] \"successfully loaded 'trivial'\"\n")
    argv = [sys.executable, "-c", EXITS_AT_SIGTERM, str(log), last_words, str(status), str(started)]
    stand_in = subprocess.Popen([*argv, "tritonserver"])
    try:
        while not started.exists():
            time.sleep(0.01)
        write_record(STATE, {"pid": stand_in.pid, "log": str(log), "shm_prefix": "tb-none-"})
        assert _stop(argparse.Namespace(timeout=30.0)) == 0
    finally:
        stand_in.kill()
        stand_in.wait()
    assert stand_in.returncode == status
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"stopped tritonserver (pid {stand_in.pid})"
    if said is None:
        assert out[1:] == []
    else:
        assert len(out) == 2 and out[1].startswith(said) and "stub died with requests in flight" in out[1]


def test_status_names_the_warmed_models_instead_of_printing_their_statistics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The record holds a page of Triton statistics per warmed model (for ``client stats``); ``status``
    is read by a person, who needs the ports and which models were warmed, not those pages."""
    monkeypatch.chdir(tmp_path)
    statistics = {"inference_stats": {"success": {"count": 1, "ns": 93748126}}, "batch_stats": []}
    warmup = {"recommender": {"1": statistics}, "trivial": {"1": statistics}}
    write_record(STATE, {"pid": 0, "http": "127.0.0.1:8000", "grpc": "127.0.0.1:8001", "warmup": warmup})
    assert _status(argparse.Namespace()) == 1  # no tritonserver at pid 0
    out = capsys.readouterr().out
    assert '"http": "127.0.0.1:8000"' in out and '"grpc": "127.0.0.1:8001"' in out
    assert "warm-up recorded (client stats subtracts it): recommender, trivial" in out
    assert "93748126" not in out and "inference_stats" not in out
