"""Which GPUs the build plans for: detected with ``nvidia-smi``, or given explicitly (``--gpus N``)."""

from __future__ import annotations

import shutil
import subprocess


def detect_gpu_count() -> int:
    """Number of NVIDIA GPUs visible here; 0 where there is no driver (CPU-only machines, CI)."""
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in listing.stdout.splitlines() if line.startswith("GPU "))
