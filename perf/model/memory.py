"""Memory per instance against a device's headroom: the article keeps 20% of each GPU free for the
allocator's fragmentation and workspaces that grow under load, counting what is already in use there."""

from __future__ import annotations

from dataclasses import dataclass

from perf.model.links import generation  # the one place GPU names are read

HEADROOM = 0.80  # the share of a device's memory the plan may fill (20% stays free)
MIB = 1024 * 1024

# Per GPU kind, MiB a serving process holds on a GPU before any model: the CUDA context (an order of
# magnitude: NVIDIA publishes none; CUDA 12 contexts with lazy module loading are a few hundred MiB,
# more on GPUs with more SMs) plus cuBLAS's recommended workspace per handle (32 MiB on Hopper, 4 MiB
# elsewhere: cublasSetWorkspace) for a few handles. ``make gpu-check`` measures each stub's
# whole figure beside these (docs/GPU.md).
CONTEXT_MIB = {"P100": 300, "V100": 350, "A100": 450, "L4": 350, "L40": 400, "H100": 550, "H200": 550,
               "B200": 600}  # fmt: skip
GENERIC_CONTEXT_MIB = 500  # a GPU the table does not name


def context_bytes(gpu_name: str) -> int:
    """The CUDA context and workspaces a serving process holds on one GPU of ``gpu_name``."""
    return CONTEXT_MIB.get(generation(gpu_name), GENERIC_CONTEXT_MIB) * MIB


@dataclass(frozen=True)
class DeviceMemory:
    """One device's memory: its total and what something else already uses, in bytes."""

    total_bytes: int
    used_bytes: int = 0

    @property
    def budget_bytes(self) -> int:
        """What a plan may add here: ``HEADROOM`` of the total, less what is in use already."""
        return max(0, int(HEADROOM * self.total_bytes) - self.used_bytes)

    def fits(self, planned_bytes: int) -> bool:
        return planned_bytes <= self.budget_bytes
