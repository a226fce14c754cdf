"""What the build plans for: the GPUs (``nvidia-smi``, or ``--gpus N``) and the usable CPU cores."""

from __future__ import annotations

import os
import subprocess


def detect_gpu_count() -> int:
    """Number of NVIDIA GPUs visible here; 0 where there is no driver (CPU-only machines, CI)."""
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in listing.stdout.splitlines() if line.startswith("GPU "))


def usable_cores() -> int:
    """The cores this process may run on (the container's share, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
