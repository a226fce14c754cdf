"""Memory per instance against a device's headroom: what fits where.

An instance holds its weights and its activations at ``max_batch_size`` (counted from the model's
graph: ``perf.plan.graph_memory``). Each GPU a plan uses also holds, once, the server process's CUDA
context and the math libraries' workspaces (``context_bytes``). A device may be filled to
``HEADROOM`` of its memory, counting what is already used there (``nvidia-smi``'s ``memory.used``):
the article keeps 20% of each GPU free for the allocator's fragmentation and workspaces that grow
under load.
"""

from __future__ import annotations

from dataclasses import dataclass

from perf.model.links import generation  # the one place GPU names are read

HEADROOM = 0.80  # the share of a device's memory the plan may fill (20% stays free)
MIB = 1024 * 1024

# Per GPU kind, MiB a serving process holds on a GPU before any model: the CUDA context (its code
# modules, the device heap and the per-thread stacks: the part that grows with the SM count and the
# CUDA version) plus cuBLAS's and cuDNN's workspaces of the instances' handles. The context is an
# order of magnitude, not a datasheet figure: NVIDIA publishes none; CUDA 12 contexts as nvidia-smi
# shows them for a process that only touched the device are a few hundred MiB, larger on GPUs with
# more SMs, and lazy module loading (CUDA_MODULE_LOADING=LAZY, the default since CUDA 12.2) keeps
# them there. The cuBLAS part is its recommended workspace per handle, 32 MiB on Hopper and 4 MiB
# elsewhere (cuBLAS API reference, cublasSetWorkspace), for a few handles. ``exporters.memory``'s CUDA
# figure excludes the context, so the two add up without counting it twice; ``make gpu-check`` sets
# each Python-backend stub's whole figure (a context of its own included) beside these (docs/GPU.md).
CONTEXT_MIB = {"P100": 300, "V100": 350, "A100": 450, "L4": 350, "L40": 400, "H100": 550, "H200": 550,
               "B200": 600}  # fmt: skip
GENERIC_CONTEXT_MIB = 500  # a GPU the table does not name


def context_bytes(gpu_name: str) -> int:
    """The CUDA context and workspaces a serving process holds on one GPU of ``gpu_name``
    (``CONTEXT_MIB``; ``GENERIC_CONTEXT_MIB`` for a GPU the table does not name)."""
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

    def share_after(self, planned_bytes: int) -> float:
        """The device's fill (0..1) with ``planned_bytes`` added to what is in use."""
        return (self.used_bytes + planned_bytes) / self.total_bytes if self.total_bytes else 0.0
