"""What the check and ``make plan`` read from ``nvidia-smi``, held against its printed output before a lent
GPU machine's minutes are spent on a parsing slip.

The rehearsal runs where there is no driver, so these are the only place the parsers meet
``nvidia-smi``'s text. An ``nvidia-smi`` on ``PATH`` answers each query as the tool prints it on a
one-H200 machine (its format: ``--format=csv[,noheader,nounits]``, the boxed header, ``topo -m``);
the outputs are written in that format, not recorded on this project's hosts (docs/GPU.md).
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from gpucheck import machine
from perf.model.memory import MIB
from perf.plan.topology import GPU_QUERY, live_topology, version_warnings

HEADER = """\
Sat Dec  5 12:00:00 2026
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 550.90.07              Driver Version: 550.90.07      CUDA Version: 12.4     |
|-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
"""
APPS = "--query-compute-apps=pid,used_memory --format=csv,noheader,nounits"
ANSWERS = {
    "--query-gpu=driver_version --format=csv,noheader,nounits": "550.90.07\n",
    "--query-gpu=memory.used --format=csv,noheader,nounits": "2815\n",
    APPS: "4711, 1020\n4712, [N/A]\n4713, 986\n",
    f"--query-gpu={GPU_QUERY} --format=csv": (
        "index, name, memory.total [MiB], memory.used [MiB]\n0, NVIDIA H200, 143771 MiB, 2815 MiB\n"
    ),
    "topo -m": (
        "\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
        "GPU0\t X \t0-15\t0\t\tN/A\n\nLegend:\n\n  X    = Self\n"
    ),
    "": HEADER,
}


def _nvidia_smi_on_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, answers: dict[str, str], rc: int = 0
) -> None:
    """An ``nvidia-smi`` executable first on ``PATH`` that prints ``answers[' '.join(argv)]``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "nvidia-smi"
    tool.write_text(
        textwrap.dedent(f"""\
        #!{sys.executable}
        import sys
        answers = {answers!r}
        print(answers.get(" ".join(sys.argv[1:]), "unknown query"), end="")
        sys.exit({rc})
        """)
    )
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")


def test_the_stubs_memory_is_read_per_pid_and_a_row_without_a_figure_is_left_out(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _nvidia_smi_on_path(monkeypatch, tmp_path, ANSWERS)
    assert machine.process_memory_mib() == {4711: 1020.0, 4713: 986.0}
    assert machine.gpu_used_mib() == 2815.0
    assert machine.smi("--query-gpu=driver_version") == "550.90.07\n"


def test_no_listed_process_and_a_failing_driver_read_as_no_figure(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A PID namespace hides the processes (an empty listing); an unreachable driver exits non-zero."""
    _nvidia_smi_on_path(monkeypatch, tmp_path, {**ANSWERS, APPS: ""})
    assert machine.process_memory_mib() is None
    failing = tmp_path / "failing"
    failing.mkdir()
    _nvidia_smi_on_path(monkeypatch, failing, {}, rc=9)
    assert machine.process_memory_mib() is None and machine.gpu_used_mib() is None


def test_a_one_gpu_host_plans_for_its_gpu_with_the_memory_already_used(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``topo -m`` on one GPU has no pair to read; the plan gets the card, its total and what is in use."""
    _nvidia_smi_on_path(monkeypatch, tmp_path, ANSWERS)
    topology = live_topology()
    assert topology is not None and topology.name == "this host"
    (gpu,) = topology.gpus
    assert (gpu.index, gpu.name) == (0, "NVIDIA H200")
    assert (gpu.memory.total_bytes, gpu.memory.used_bytes) == (143771 * MIB, 2815 * MIB)
    assert topology.levels == {}


def test_the_drivers_cuda_version_is_read_from_the_header() -> None:
    assert version_warnings(HEADER, "12.4") == ()
    (older,) = version_warnings(HEADER, "12.6")
    assert "driver 550.90.07 supports CUDA 12.4" in older and "12.6" in older
    (unread,) = version_warnings("NVIDIA-SMI has failed", "12.4")
    assert "no CUDA version" in unread
