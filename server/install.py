"""Find a tritonserver (``$TRITONSERVER``, ``PATH`` as in the NGC container, then the nvidia-pytriton
wheel's) and assemble its backend folder: ours takes the place of the wheel's missing onnxruntime."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import python_backend
from python_backend.atomic_files import copy_file


class ServerError(RuntimeError):
    """tritonserver could not be found, started, or did not become ready."""


@dataclass(frozen=True)
class ServerInstall:
    binary: Path
    backends: Path  # the install's own backend folder
    library_dirs: tuple[Path, ...]
    origin: str  # "env", "path" or "wheel"


def _wheel_root() -> Path | None:
    """The wheel's ``tritonserver`` folder, found without importing PyTriton (whose imports a machine
    given only the wheel lacks)."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "tritonserver"


def find_install() -> ServerInstall:
    """The first tritonserver in the documented search order, or ``ServerError`` saying what was tried."""
    given = os.environ.get("TRITONSERVER")
    found = given or shutil.which("tritonserver")  # which() finds executable files only
    if found:
        binary = Path(found)
        if not (binary.is_file() and os.access(binary, os.X_OK)):
            raise ServerError(f"$TRITONSERVER={binary} is not an executable file")
        return ServerInstall(
            binary, binary.resolve().parent.parent / "backends", (), "env" if given else "path"
        )
    root = _wheel_root()
    if root is None or not (root / "bin" / "tritonserver").is_file():
        raise ServerError(
            "no tritonserver: set $TRITONSERVER, put one on PATH, or `make setup` (nvidia-pytriton)"
        )
    libs = root.parent.parent / "nvidia_pytriton.libs"
    return ServerInstall(root / "bin" / "tritonserver", root / "backends", (libs,), "wheel")


def replace_file(source: Path, target: Path) -> None:
    """Copy ``source`` over ``target`` by rename (a running stub's binary cannot be opened for
    writing: "Text file busy"); an identical target is left alone."""
    if target.is_file():
        a, b = source.stat(), target.stat()
        if a.st_size == b.st_size and int(a.st_mtime) == int(b.st_mtime):
            return
    copy_file(source, target)


def assemble_backends(install: ServerInstall, destination: Path) -> Path:
    """Build the ``--backend-directory`` folder: the install's backends plus what it lacks (idempotent)."""
    destination.mkdir(parents=True, exist_ok=True)
    for backend in sorted(install.backends.iterdir()) if install.backends.is_dir() else []:
        target = destination / backend.name
        if backend.name == "python" and install.origin == "wheel":
            target.mkdir(exist_ok=True)
            for item in ("libtriton_python.so", "triton_python_backend_utils.py"):
                replace_file(backend / item, target / item)
            version = f"{sys.version_info.major}.{sys.version_info.minor}"
            stub = install.backends.parent / "python_backend_stubs" / version / "triton_python_backend_stub"
            if not stub.is_file():
                raise ServerError(
                    f"the nvidia-pytriton wheel has no Python backend stub for Python {version}"
                )
            replace_file(stub, target / "triton_python_backend_stub")
        else:
            if target.is_symlink() and target.resolve() != backend.resolve():
                target.unlink()  # stale link from an earlier install (e.g. a recreated venv)
            if not target.exists():
                target.symlink_to(backend.resolve(), target_is_directory=True)
    ours = destination / "onnxruntime"
    if not (ours / "libtriton_onnxruntime.so").exists():  # no native onnxruntime backend
        if ours.is_symlink():
            ours.unlink()
        python_backend.install(python_backend.ONNXRUNTIME_BACKEND, ours)
    return destination
