"""The machine a plan is for: its GPUs, their memory and the link between every pair, from ``nvidia-smi
topo -m`` and ``--query-gpu`` run here or recorded in a ``TOPOLOGY=`` folder; no GPU: the CPU."""

from __future__ import annotations

import csv
import logging
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from perf.errors import OptionError
from perf.model.links import HOST, Link, generic_note, link_for
from perf.model.memory import MIB, DeviceMemory

log = logging.getLogger(__name__)
FIXTURES = Path(__file__).parent / "topologies"
GPU_QUERY = "index,name,memory.total,memory.used"
_GPU_COLUMN = re.compile(r"^GPU(\d+)$")


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory: DeviceMemory


@dataclass(frozen=True)
class Topology:
    """GPUs and the ``topo -m`` level between each pair (``levels[(a, b)]``); no GPUs: the CPU."""

    name: str
    gpus: tuple[Gpu, ...]
    levels: dict[tuple[int, int], str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    @property
    def on_gpu(self) -> bool:
        return bool(self.gpus)

    @property
    def indices(self) -> tuple[int, ...]:
        return tuple(g.index for g in self.gpus)

    def gpu(self, index: int) -> Gpu:
        return next(g for g in self.gpus if g.index == index)

    def link(self, a: int, b: int) -> Link:
        """The link a boundary from GPU ``a`` to GPU ``b`` crosses (one device: the host's, none)."""
        return HOST if a == b else link_for(self.levels[(a, b)], self.gpu(a).name)


def _mib(cell: str, what: str) -> int:
    if not (match := re.fullmatch(r"\s*(\d+)\s*MiB\s*", cell)):
        raise OptionError(f"gpus.csv: {what} {cell!r} is not '<n> MiB' (nvidia-smi --format=csv)")
    return int(match.group(1)) * MIB


def parse_gpus(text: str) -> tuple[Gpu, ...]:
    """``nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv`` as printed."""
    if not (rows := list(csv.reader(text.strip().splitlines(), skipinitialspace=True))):
        raise OptionError("gpus.csv is empty")
    header = [h.strip() for h in rows[0]]
    wanted = ["index", "name", "memory.total [MiB]", "memory.used [MiB]"]
    if header[:4] != wanted:
        raise OptionError(f"gpus.csv: header {header} is not {wanted} (nvidia-smi --query-gpu={GPU_QUERY})")
    gpus = []
    for line, row in enumerate(rows[1:], start=2):
        if len(row) < 4:
            raise OptionError(f"gpus.csv line {line}: {row} has fewer than 4 fields")
        total, used = _mib(row[2], "memory.total"), _mib(row[3], "memory.used")
        gpus.append(Gpu(int(row[0]), row[1].strip(), DeviceMemory(total, used)))
    return tuple(gpus)


def parse_topo(text: str) -> dict[tuple[int, int], str]:
    """``nvidia-smi topo -m``'s level between every pair of GPUs (other columns and the legend ignored)."""
    if not (lines := [line for line in text.splitlines() if line.strip()]):
        raise OptionError("topo.txt is empty")
    header = [cell.strip() for cell in lines[0].split("\t")][1:]
    if not (gpu_columns := [int(m.group(1)) for m in map(_GPU_COLUMN.match, header) if m]):
        raise OptionError("topo.txt: its first line names no GPU column (nvidia-smi topo -m prints GPU0 ...)")
    levels: dict[tuple[int, int], str] = {}
    for line in lines[1:]:
        cells = [cell.strip() for cell in line.split("\t")]
        if not (row := _GPU_COLUMN.match(cells[0])):
            continue
        a = int(row.group(1))
        for b, level in zip(gpu_columns, cells[1 : 1 + len(gpu_columns)], strict=True):
            if a != b:
                levels[(a, b)] = level
    if missing := [(a, b) for a in gpu_columns for b in gpu_columns if a != b and (a, b) not in levels]:
        raise OptionError(f"topo.txt: no level for GPU pairs {missing[:4]}")
    return levels


def topology_from(name: str, topo_text: str, gpus_text: str, warnings: tuple[str, ...] = ()) -> Topology:
    gpus = parse_gpus(gpus_text)
    levels = parse_topo(topo_text) if len(gpus) > 1 else {}
    listed = {a for a, _ in levels}
    if len(gpus) > 1 and listed != {g.index for g in gpus}:
        raise OptionError(f"topo.txt lists GPUs {sorted(listed)}, gpus.csv {[g.index for g in gpus]}")
    generic = tuple(dict.fromkeys(note for g in gpus if (note := generic_note(g.name))))
    topology = Topology(name, gpus, levels, warnings + generic)
    for a, b in levels:
        topology.link(a, b)  # every level and GPU known to the link table, or a clear error now
    return topology


def topology_folder(location: str) -> Topology:
    """``TOPOLOGY=``: a folder with ``topo.txt`` and ``gpus.csv``, or the name of a shipped one."""
    folder = Path(location)
    if not folder.is_dir():
        folder = FIXTURES / location
    if not folder.is_dir():
        shipped = ", ".join(sorted(p.name for p in FIXTURES.iterdir() if p.is_dir()))
        raise OptionError(f"TOPOLOGY={location}: no such folder, nor a shipped topology ({shipped})")
    topo, gpus = folder / "topo.txt", folder / "gpus.csv"
    if missing := next((path for path in (topo, gpus) if not path.is_file()), None):
        raise OptionError(f"TOPOLOGY={location}: {missing} is missing")
    return topology_from(folder.name, topo.read_text(), gpus.read_text())


def cpu_topology() -> Topology:
    return Topology("cpu", ())


def _smi(*args: str) -> str:
    return subprocess.run(
        ["nvidia-smi", *args], capture_output=True, text=True, timeout=30, check=True
    ).stdout


def version_warnings(header: str, onnxruntime_cuda: str | None) -> tuple[str, ...]:
    """The driver's CUDA version against onnxruntime's: an older driver fails at the first GPU session, which
    a plan should say first."""
    driver = re.search(r"Driver Version:\s*([\d.]+)", header)
    if not (cuda := re.search(r"CUDA Version:\s*([\d.]+)", header)):
        return ("nvidia-smi printed no CUDA version; cannot check it against onnxruntime's",)
    if onnxruntime_cuda is None:
        return ()
    have = tuple(int(p) for p in cuda.group(1).split(".")[:2])
    need = tuple(int(p) for p in onnxruntime_cuda.split(".")[:2])
    if have < need:
        return (
            f"driver {driver.group(1) if driver else '?'} supports CUDA {cuda.group(1)}, but onnxruntime "
            f"was built for CUDA {onnxruntime_cuda}: its CUDA provider will not load; update the driver",
        )
    return ()


def live_topology() -> Topology | None:
    """This host's GPUs through ``nvidia-smi`` (None where there is none)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        gpus_text = _smi(f"--query-gpu={GPU_QUERY}", "--format=csv")
        topo_text = _smi("topo", "-m")
        header = _smi()
    except (OSError, subprocess.SubprocessError) as error:
        log.info("nvidia-smi failed (%s): planning for the CPU", error)
        return None
    try:
        from onnxruntime.capi.build_and_package_info import cuda_version
    except ImportError:
        cuda_version = None
    return topology_from("this host", topo_text, gpus_text, version_warnings(header, cuda_version or None))
