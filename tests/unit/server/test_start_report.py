"""``server.start_report``: a start that times out names each model Triton's log shows still loading
and that model's stub, read from ``/proc``. The "server" here is a real process whose children carry a
stub's argv (``triton_python_backend_stub <model file> <region> ... <instance name>``): one that sleeps
(alive, hung at start), one that has exited unreaped, as a stub dead before its first message is, and a
fork that never became a stub, as 2.51's child between its fork and its exec of the stub."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from server.install import ServerError
from server.launcher import ServerOptions, TritonServer
from server.start_report import StubDiedAtStartError, loading_models, still_loading

LOG = """\
I1206 20:28:42.416356 7781 model_lifecycle.cc:472] "loading: recommender_pipeline_dense:1"
I1206 20:28:42.416387 7781 model_lifecycle.cc:472] "loading: recommender_pipeline_embedding:1"
I1206 20:28:42.416409 7781 model_lifecycle.cc:472] "loading: trivial:1"
I1206 20:28:42.416409 7781 model_lifecycle.cc:472] "loading: broken:1"
I1206 20:28:42.426561 7781 python_be.cc:2249] "TRITONBACKEND_ModelInstanceInitialize: trivial_0_0"
I1206 20:28:43.221587 7781 model_lifecycle.cc:839] "successfully loaded 'trivial'"
E1206 20:28:43.221587 7781 model_lifecycle.cc:641] "failed to load 'broken' version 1: Internal: no"
"""

# The "server": starts a sleeping stub of the embedding stage and one of the dense stage that exits at
# once and is never reaped, forks a child that stays as it is, prints their pids, then waits.
SERVER = """
import os, subprocess, sys, time
from pathlib import Path
def stub(model, code):
    model_file = Path(sys.argv[1], model, "1", "model.py")
    model_file.parent.mkdir(parents=True)
    model_file.write_text(code)
    argv = ["/opt/backends/python/triton_python_backend_stub", str(model_file), "tbtest_region", "1", "1",
            "1", "/opt/backends/python", "handle", f"{model}_0_0"]
    return subprocess.Popen(argv, executable=sys.executable).pid
hung = stub("recommender_pipeline_embedding", "import time\\ntime.sleep(60)\\n")
dead = stub("recommender_pipeline_dense", "")
forked = os.fork()
if forked == 0:
    time.sleep(60)
    os._exit(0)
print(hung, dead, forked, flush=True)
time.sleep(60)
"""


def test_the_models_still_loading_are_those_begun_and_neither_loaded_nor_failed() -> None:
    assert loading_models(LOG.splitlines()) == [
        "recommender_pipeline_dense",
        "recommender_pipeline_embedding",
    ]
    assert loading_models([]) == [] and still_loading(None, ["nothing about loading"]) == ("", False)


def test_a_start_that_times_out_names_each_loading_model_and_its_stub(tmp_path: Path) -> None:
    server_process = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(tmp_path / "models")], stdout=subprocess.PIPE, text=True
    )
    sleepers: list[int] = []
    try:
        assert server_process.stdout is not None
        hung, dead, forked = map(int, server_process.stdout.readline().split())
        sleepers += [hung, forked]
        deadline = time.monotonic() + 30
        settled = f"stub pid {hung} ", f"not reaped by tritonserver: pid {dead}"
        while not all(part in still_loading(server_process.pid, LOG.splitlines())[0] for part in settled):
            assert time.monotonic() < deadline, "the stubs never took their argv, or the dead one lives"
            time.sleep(0.05)  # a child's argv is its own once it has exec'd
        time.sleep(1.0)  # so that it has existed a whole second
        server = TritonServer(ServerOptions(repository=tmp_path, startup_timeout_s=0.5, workdir=tmp_path))
        server.log_path.write_text(LOG)
        server.process = server_process
        with pytest.raises(ServerError) as raised:
            server.wait_ready()
        # a retry only for the dead stub's model: the hung one, alive, is no evidence of a death
        hung_only = [line for line in LOG.splitlines() if "recommender_pipeline_dense" not in line]
        died = [still_loading(server_process.pid, log)[1] for log in (LOG.splitlines(), hung_only)]
    finally:
        server_process.kill()
        server_process.wait()
        for orphan in sleepers:  # their parent is gone; they would sleep on
            with contextlib.suppress(ProcessLookupError):
                os.kill(orphan, signal.SIGKILL)
    assert died == [True, False] and isinstance(raised.value, StubDiedAtStartError)
    message = str(raised.value)
    lines = message.splitlines()
    assert lines[0] == "tritonserver not ready after 0s; models still loading:"
    embedding = next(line for line in lines if line.startswith("  recommender_pipeline_embedding: "))
    described = re.search(rf"stub pid {hung} \(recommender_pipeline_embedding_0_0\) alive, state [A-Z], "
                          r"started (\d+) s ago, \d+\.\d s of CPU", embedding)  # fmt: skip
    assert described and int(described.group(1)) >= 1
    assert "  recommender_pipeline_dense: no stub of it runs" in lines
    assert f"  exited stubs not reaped by tritonserver: pid {dead}" in lines
    other = f"  tritonserver's other children (not yet a stub): pid {forked} (python"
    assert any(line.startswith(other) for line in lines)
    assert not any(line.startswith(("  trivial", "  broken")) for line in lines)
    assert message.endswith(LOG.rstrip()) and "log:" in lines
