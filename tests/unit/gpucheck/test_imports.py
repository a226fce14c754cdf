"""The import rule: the check imports nothing the lent GPU machine lacks (pydantic, PyTriton's Python API),
and the rehearsal stands in only that machine's packages (docs/GPU.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gpucheck.rehearsal import closure

ROOT = Path(__file__).resolve().parents[3]


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_the_check_imports_nothing_the_gpu_machine_lacks() -> None:
    """``gpucheck.run`` and everything it imports, and finding the server: neither pydantic nor
    PyTriton's Python API (nor what that needs) is loaded; the GPU machine has neither (DESIGN.md §3).
    The rehearsal proves it again with nothing else on ``sys.path``."""
    code = (
        "import sys\n"
        "import gpucheck.run, gpucheck.rehearsal\n"
        "from server.install import find_install\n"
        "find_install()\n"
        "lacking = {'pydantic', 'pydantic_core', 'pytriton', 'zmq', 'sh', 'typer'}\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & lacking))\n"
    )
    assert _run(code) == "[]"


def test_finding_the_wheels_tritonserver_does_not_import_pytriton() -> None:
    code = "import sys; import server.install as s; s.find_install(); print('pytriton' in sys.modules)"
    assert _run(code) == "False"


def test_the_rehearsal_stands_in_only_the_gpu_machines_packages() -> None:
    names = {d.metadata["Name"].lower().replace("_", "-") for d in closure(("torch", "onnx"))}
    assert {"torch", "onnx", "numpy"} <= names
    assert not names & {"pydantic", "nvidia-pytriton", "tritonclient", "protobuf"}  # carried or absent there
