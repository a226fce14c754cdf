"""Make the virtual environment importable inside the Python backend's stub.

The stub embeds the system libpython in isolated mode: it ignores ``PYTHONPATH`` and the venv, so
``import numpy`` fails on a fresh machine. The launcher exports ``PYTHONPATH`` anyway; this reads it
and puts those folders first on ``sys.path`` (before the system's dist-packages, which may hold older
copies of the same packages). Inside the NGC container ``PYTHONPATH`` is unset and nothing changes.
Standard library only: it runs before anything else can be imported.
"""

import os
import sys


def add_launcher_paths() -> None:
    """Prepend the launcher's ``PYTHONPATH`` entries to ``sys.path`` once, keeping their order."""
    wanted = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    sys.path[:0] = wanted
