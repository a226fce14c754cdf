"""What a stage boundary costs: bytes over the link between two devices, plus a per-hop latency; one table
with its sources. Bandwidths are GB/s (10⁹ bytes/s) per direction:

* NVLink per link (``NV#`` is ``#`` bonded links): NVIDIA's NVLink page and the V100, A100, H100/H200
  datasheets (https://www.nvidia.com/en-us/data-center/nvlink/): the total per GPU over the link count.
* PCIe per direction of an x16 slot: the PCI-SIG base specifications 3.0, 4.0, 5.0 (``PIX``, ``PXB``,
  ``PHB`` and ``NODE`` go at the slot's rate); the GPU's generation from its datasheet.
* ``SYS`` crosses sockets, where the CUDA runtime stages the copy through host memory: two PCIe copies,
  modelled as half the PCIe bandwidth (an assumption, labelled as one).
* A GPU the table does not name takes the generic figures of its link type (``generic``, and the plan
  says so): NVLink 2-4's per link, PCIe Gen4 (every data-centre GPU since Ampere), ``SYS`` half of it.

Per-hop latencies are the order of magnitude the CUDA samples' ``p2pBandwidthLatencyTest`` reports;
assumptions too, and at the batch sizes served the bandwidth term rules."""

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
UNKNOWN_LEVEL = "unknown link level {!r} (expected NV#, PIX, PXB, PHB, NODE or SYS)"


@dataclass(frozen=True)
class Link:
    """A link between two devices: its ``nvidia-smi`` level, bandwidth and per-hop latency."""

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
    """The table's key in a GPU's name (``NVIDIA A100-SXM4-80GB`` → ``A100``); None for an unknown GPU."""
    words = "".join(c if c.isalnum() else " " for c in gpu_name).split()
    return next((key for key in [*NVLINK_PER_LINK_GBS, *GPU_PCIE] if key in words), None)


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
    """The link behind a ``topo -m`` cell between two GPUs of ``gpu_name``."""
    key = generation(gpu_name)
    generic = key is None
    pcie = PCIE_GBS[GPU_PCIE.get(key, GENERIC_PCIE)]
    if level.startswith("NV"):
        try:
            links = int(level[2:])
        except ValueError:
            raise OptionError(UNKNOWN_LEVEL.format(level)) from None
        if key is not None and key not in NVLINK_PER_LINK_GBS:
            raise OptionError(f"{gpu_name} shows {level}, but the link table has no NVLink figure for it")
        per_link = GENERIC_NVLINK_GBS if key is None else NVLINK_PER_LINK_GBS[key]
        return Link(level, links * per_link, HOP_LATENCY_US["NV"], generic)
    if level in (*PCIE_LEVELS, "SYS"):
        return Link(level, pcie * (SYS_SHARE if level == "SYS" else 1.0), HOP_LATENCY_US[level], generic)
    raise OptionError(UNKNOWN_LEVEL.format(level))


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
