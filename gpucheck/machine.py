"""What the machine running the check is: its Python, torch, GPU and driver. Read, never changed: the
card's clocks, power and modes stay as found."""

from __future__ import annotations

import contextlib
import ctypes
import gzip
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

MIB = 1 << 20


@dataclass
class MachineFacts:
    python: str
    torch: str
    torch_cuda: str | None
    numpy: str
    onnxruntime: str
    onnxruntime_providers: list[str]
    device: str  # torch.cuda.get_device_name(0), or "cpu"
    cuda_available: bool
    gpu_total_mib: float | None = None
    driver: str | None = None
    smi_header: str = ""
    libpython: str = ""  # where the stub's libpython came from
    cpu_count: int = 0


def smi(*query: str) -> str | None:
    """``nvidia-smi`` with ``query`` (CSV, no header, no units), or None where it is absent or fails."""
    try:
        command = ["nvidia-smi", *query, "--format=csv,noheader,nounits"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def facts() -> MachineFacts:
    import onnxruntime

    cuda = torch.cuda.is_available()
    found = MachineFacts(
        python=platform.python_version(),
        torch=torch.__version__,
        torch_cuda=torch.version.cuda,
        numpy=np.__version__,
        onnxruntime=onnxruntime.__version__,  # of whichever distribution installed it (-gpu, or not)
        onnxruntime_providers=list(onnxruntime.get_available_providers()),
        device=torch.cuda.get_device_name(0) if cuda else "cpu",
        cuda_available=cuda,
        cpu_count=os.cpu_count() or 0,
    )
    if cuda:
        found.gpu_total_mib = torch.cuda.get_device_properties(0).total_memory / MIB
        driver = smi("--query-gpu=driver_version")
        found.driver = driver.strip().splitlines()[0] if driver else None
        with contextlib.suppress(OSError, subprocess.SubprocessError):  # no header then
            header = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout
            found.smi_header = "\n".join(header.splitlines()[:4])
    return found


def process_memory_mib() -> dict[int, float] | None:
    """``{pid: MiB}`` nvidia-smi lists (None where it lists none: a PID namespace can hide them)."""
    listing = smi("--query-compute-apps=pid,used_memory") or ""
    rows = [[part.strip() for part in line.split(",")] for line in listing.strip().splitlines()]
    memory = {int(pid): float(mib) for pid, mib in rows if pid.isdigit() and mib.replace(".", "").isdigit()}
    return memory or None


def gpu_used_mib() -> float | None:
    """The GPU's used memory as nvidia-smi counts it (every process's, the contexts included)."""
    used = smi("--query-gpu=memory.used")
    try:
        return float(used.strip().splitlines()[0]) if used else None
    except ValueError:
        return None


def stub_libpython(carried: Path, workdir: Path) -> str:
    """Make the stub find ``libpython3.X.so.1.0`` (a static Python has none) through this process's
    environment, which the server inherits: the loader's, this ``LIBDIR``'s or the carried one."""
    soname = f"libpython{sys.version_info.major}.{sys.version_info.minor}.so.1.0"
    try:
        ctypes.CDLL(soname)
        return f"{soname} from the system's library path"
    except OSError:
        pass
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    if libdir and (Path(libdir) / soname).is_file():
        _use_libpython_in(libdir)
        return f"{soname} from {libdir} (this Python's LIBDIR), with PYTHONHOME={sys.base_prefix}"
    packed = carried / f"{soname}.gz"
    if packed.is_file():
        workdir.mkdir(parents=True, exist_ok=True)
        with gzip.open(packed) as source, open(workdir / soname, "wb") as out:
            shutil.copyfileobj(source, out)
        _use_libpython_in(str(workdir))
        return f"{soname} carried (gpucheck/carry.py), with PYTHONHOME={sys.base_prefix}"
    raise RuntimeError(
        f"the Python-backend stub links {soname}, which this machine lacks (not on the library path, not in "
        f"{libdir or 'LIBDIR'}) and the carried folder does not hold: rebuild it with `make gpu-carry` on a "
        "machine with a shared Python of this version"
    )


def _use_libpython_in(folder: str) -> None:
    """The stub loads libpython from ``folder`` and takes this Python's stdlib (``PYTHONHOME``: a relocated
    build, e.g. uv's, finds it only so)."""
    os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [folder, os.environ.get("LD_LIBRARY_PATH")]))
    os.environ["PYTHONHOME"] = sys.base_prefix
