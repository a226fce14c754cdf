"""``python -m client health`` talks to a server without importing torch, onnx or onnxruntime (they
cost seconds to import); only ``infer --check``, which rebuilds the torch model, pulls them in."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "onnx", "onnxruntime")
PROBE = """
import sys
from client.__main__ import main
code = main(sys.argv[1:])
print(code, [m for m in {heavy!r} if m in sys.modules])
"""


def _run(*argv: str) -> str:
    probe = PROBE.format(heavy=HEAVY)
    done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_health_imports_no_torch() -> None:
    # Port 9 on loopback: nothing listens, so after its imports the command reports the server as not
    # live (exit 1, as for any server that cannot serve: a probe, or a supervisor restarting it).
    assert _run("--url", "127.0.0.1:9", "health") == "1 []"


def test_infer_check_does_import_torch() -> None:
    """The probe can see torch when a command does import it: the check above is not vacuous."""
    code, modules = _run("--url", "127.0.0.1:9", "infer", "--model", "recommender", "--check").split(" ", 1)
    assert code == "2" and "torch" in modules
