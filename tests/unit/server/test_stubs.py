"""``server.stubs``: a Python-backend stub read from ``/proc``, by its argv as Triton starts it
(``triton_python_backend_stub <model file> <shm region> ... <instance name>``), here a real child
process started under that name."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from server.stubs import Stub, kill_stray_stubs, server_stubs, stub_regions, stubs_with_prefix


def _ours(pid: int) -> list[Stub]:
    """This process's children as stubs, the one started here alone (a zombie child of another test
    would be listed too: a zombie has no argv to tell it by)."""
    return [stub for stub in server_stubs(os.getpid()) if stub.pid == pid]


def test_a_stub_is_found_by_its_server_and_its_region_then_killed_as_a_stray(tmp_path: Path) -> None:
    model_file = tmp_path / "recommender" / "3" / "model.py"
    model_file.parent.mkdir(parents=True)
    model_file.write_text("import time\ntime.sleep(60)\n")
    prefix = f"tbtest{uuid.uuid4().hex[:8]}_"
    argv = ["/opt/backends/python/triton_python_backend_stub", str(model_file), f"{prefix}region"]
    argv += ["1048576", "1048576", str(os.getpid()), "/opt/backends/python", "handle", "recommender_0_0"]
    stub = subprocess.Popen(argv, executable=sys.executable)
    try:
        deadline = time.monotonic() + 10
        while not any(s.alive for s in _ours(stub.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)  # the child's argv is its own once it has exec'd
        (found,) = _ours(stub.pid)
        assert (found.pid, found.model, found.version, found.instance) == (
            stub.pid, "recommender", "3", "recommender_0_0"
        )  # fmt: skip
        assert found.alive and not found.stopped and found.shm_region == f"{prefix}region"
        assert stubs_with_prefix(prefix) == [stub.pid] and f"{prefix}region" in stub_regions()
        assert server_stubs(os.getppid()) == [] and stubs_with_prefix(f"{prefix}other") == []
        kill_stray_stubs(prefix)
        deadline = time.monotonic() + 10
        while stubs_with_prefix(prefix) and time.monotonic() < deadline:
            time.sleep(0.05)
        (zombie,) = _ours(stub.pid)  # exited, not yet reaped: known by its pid alone
        assert not zombie.alive
    finally:
        stub.kill()
        stub.wait()
    assert _ours(stub.pid) == []
