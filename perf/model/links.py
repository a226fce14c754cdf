"""What a stage boundary costs: bytes over the link between two devices, plus a per-hop latency.

One table, with its sources, so every figure the planner uses for a link is in one place.

Bandwidths are per direction (a boundary sends one way), in GB/s (10⁹ bytes/s):

* **NVLink**, per link, by GPU generation; ``nvidia-smi topo -m`` prints ``NV#`` for a bonded set of
  ``#`` links, so a pair's bandwidth is ``# ×`` the per-link figure. NVIDIA's NVLink page gives the
  total per GPU (both directions) and the link count: P100 160 GB/s over 4 links (NVLink 1), V100 300
  GB/s over 6 (NVLink 2), A100 600 GB/s over 12 (NVLink 3), H100/H200 900 GB/s over 18 (NVLink 4),
  B200 1.8 TB/s over 18 (NVLink 5): 20, 25, 25, 25 and 50 GB/s per link and direction.
  Source: https://www.nvidia.com/en-us/data-center/nvlink/ and the V100, A100, H100/H200 datasheets.
* **PCIe**, per direction of an x16 slot by generation: Gen3 15.75, Gen4 31.5, Gen5 63 GB/s (PCI-SIG
  PCIe base specifications 3.0, 4.0, 5.0: 8, 16, 32 GT/s × 16 lanes, 128b/130b encoding). The GPU's
  generation: V100 SXM2 Gen3; A100, L4 Gen4; H100, H200 Gen5 (their datasheets). ``PIX``, ``PXB``,
  ``PHB`` and ``NODE`` go over PCIe at the slot's rate.
* **SYS** crosses the SMP interconnect between CPU sockets (``nvidia-smi topo -m``'s legend), where
  peer-to-peer access is generally not supported and the CUDA runtime stages the copy through host
  memory: two PCIe copies, modelled as half the PCIe bandwidth. An assumption, labelled as one.
* **host**: both stages on one device (or on the CPU): no copy beyond what the stage costs measure.

* **Generic figures** for a GPU the table does not name (an RTX A6000, T4, A10, A40, L40S...): the
  link type alone decides. ``NV#`` takes NVLink 2-4's 25 GB/s per link and direction (``GENERIC_NVLINK_GBS``;
  NVLink 1 had 20, NVLink 5 has 50), the PCIe levels PCIe Gen4 x16 (``GENERIC_PCIE``: every NVIDIA
  data-centre and workstation GPU since Ampere, 2020, is Gen4 or later; a Gen3 card such as the T4 has
  half), ``SYS`` half of that as above. Such a link is marked ``generic`` and the plan says so.

Per-hop latencies are the order of magnitude of a ``cudaMemcpyPeer`` of a few bytes as the CUDA
samples' ``p2pBandwidthLatencyTest`` reports it (a few µs over NVLink, about twice that over PCIe,
more across sockets). They are assumptions too; at the batch sizes served, the bandwidth term rules.
"""

from __future__ import annotations

from dataclasses import dataclass

from perf.errors import OptionError

GB = 1e9
NVLINK_PER_LINK_GBS = {"P100": 20.0, "V100": 25.0, "A100": 25.0, "H100": 25.0, "H200": 25.0, "B200": 50.0}
PCIE_GBS = {"gen3": 15.75, "gen4": 31.5, "gen5": 63.0}
GPU_PCIE = {"P100": "gen3", "V100": "gen3", "A100": "gen4", "L4": "gen4", "L40": "gen4", "H100": "gen5",
            "H200": "gen5", "B200": "gen5"}  # fmt: skip
HOP_LATENCY_US = {"NV": 5.0, "PIX": 8.0, "PXB": 8.0, "PHB": 10.0, "NODE": 12.0, "SYS": 20.0, "host": 0.0}
GENERIC_NVLINK_GBS = 25.0  # per link and direction where the GPU is unknown: NVLink 2, 3 and 4
GENERIC_PCIE = "gen4"  # the PCIe generation assumed where the GPU is unknown
SYS_SHARE = 0.5  # of the PCIe bandwidth: a copy staged through host memory is two PCIe copies
PCIE_LEVELS = ("PIX", "PXB", "PHB", "NODE")


@dataclass(frozen=True)
class Link:
    """A link between two devices as the planner sees it: its ``nvidia-smi`` level, bandwidth and
    per-hop latency."""

    level: str  # "NV12", "PIX", "SYS", "host", ...
    gbs: float  # GB/s per direction (inf for host)
    latency_us: float
    generic: bool = False  # the figure is the link type's generic one (the GPU is not in the table)

    @property
    def label(self) -> str:
        if self.level == "host":
            return self.level
        return f"{self.level} ({self.gbs:g} GB/s{', generic' if self.generic else ''})"


HOST = Link("host", float("inf"), 0.0)


def generation(gpu_name: str) -> str | None:
    """The table's key in a GPU's name (``NVIDIA A100-SXM4-80GB`` → ``A100``); None for a GPU the
    table does not name (its links then take the generic figures of their type)."""
    words = "".join(c if c.isalnum() else " " for c in gpu_name).split()
    for key in sorted(set(NVLINK_PER_LINK_GBS) | set(GPU_PCIE), key=len, reverse=True):
        if key in words:
            return key
    return None


def generic_note(gpu_name: str) -> str:
    """What the plan says of a GPU whose links take generic figures (empty for a known one)."""
    if generation(gpu_name) is not None:
        return ""
    return (
        f"{gpu_name}: no link figures for this GPU in perf.model.links; its links take the generic "
        f"figures of their type (NV#: {GENERIC_NVLINK_GBS:g} GB/s per link, PIX/PXB/PHB/NODE: PCIe "
        f"{GENERIC_PCIE} x16 {PCIE_GBS[GENERIC_PCIE]:g} GB/s, SYS: half of that), not measured ones"
    )


def link_for(level: str, gpu_name: str) -> Link:
    """The link behind a ``topo -m`` cell between two GPUs of ``gpu_name`` (a GPU the table does not
    name: the generic figures of the level)."""
    key = generation(gpu_name)
    generic = key is None
    pcie = PCIE_GBS[GPU_PCIE.get(key, GENERIC_PCIE)]
    if level.startswith("NV"):
        try:
            links = int(level[2:])
        except ValueError:
            raise OptionError(_unknown_level(level)) from None
        if key is not None and key not in NVLINK_PER_LINK_GBS:
            raise OptionError(f"{gpu_name} shows {level}, but the link table has no NVLink figure for it")
        per_link = GENERIC_NVLINK_GBS if key is None else NVLINK_PER_LINK_GBS[key]
        return Link(level, links * per_link, HOP_LATENCY_US["NV"], generic)
    if level in PCIE_LEVELS:
        return Link(level, pcie, HOP_LATENCY_US[level], generic)
    if level == "SYS":
        return Link(level, pcie * SYS_SHARE, HOP_LATENCY_US["SYS"], generic)
    raise OptionError(_unknown_level(level))


def _unknown_level(level: str) -> str:
    return f"unknown link level {level!r} (expected NV#, PIX, PXB, PHB, NODE or SYS)"


@dataclass(frozen=True)
class Transfer:
    """One stage boundary: ``bytes_per_sample`` (at the boundary's dtype) over ``link``."""

    bytes_per_sample: float
    link: Link = HOST

    def seconds(self, batch: int) -> float:
        """A batch crossing: the hop latency plus its bytes over the bandwidth (0 on one device)."""
        if self.link.level == "host":
            return 0.0
        return self.link.latency_us * 1e-6 + batch * self.bytes_per_sample / (self.link.gbs * GB)

    def capacity(self, batch: int) -> float:
        """Samples per second the link carries at most, sending batches of ``batch`` back to back."""
        took = self.seconds(batch)
        return batch / took if took > 0 else float("inf")
