"""The stub's embedded libpython ignores ``PYTHONPATH`` and the venv: put the ``PYTHONPATH`` the
launcher exports first on ``sys.path``. Standard library only: it runs before anything else."""

import os
import sys


def add_launcher_paths() -> None:
    wanted = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    sys.path[:0] = wanted
