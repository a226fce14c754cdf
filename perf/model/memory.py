"""Memory per instance against a device's headroom: what fits where.

An instance holds its weights and its activations at ``max_batch_size`` (measured once per exported
file: ``exporters.memory``). A device may be filled to ``HEADROOM`` of its memory, counting what is
already used there (``nvidia-smi``'s ``memory.used``): the article keeps 20% of each GPU free for
the allocator's fragmentation, CUDA's own context and workspaces that grow under load.
"""

from __future__ import annotations

from dataclasses import dataclass

HEADROOM = 0.80  # the share of a device's memory the plan may fill (20% stays free)
MIB = 1024 * 1024


@dataclass(frozen=True)
class DeviceMemory:
    """One device's memory: its total and what something else already uses, in bytes."""

    index: int
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
