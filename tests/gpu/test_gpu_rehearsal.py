"""``make gpu-carry`` and ``make gpu-rehearsal`` for real (docs/GPU.md): the carried folder fits the
lent machine's travel budget, and the GPU check's own script runs here on the CPU, with the carried
wheels and only the packages the GPU machine has, through a real tritonserver, and writes what the
device tool can bring back. Needs PyPI for the wheels (``pip download``), as ``make gpu-carry`` does."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from gpucheck import carry, report
from gpucheck.rehearsal import rehearse, validate

# A hang guard, not a speed check: over three times the rehearsal on a loaded two-core host, and above
# the carry's own 1200 s limit (a cold pip cache downloads every wheel), so that limit speaks first.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]
ROOT = Path(__file__).resolve().parents[2]


def test_make_gpu_carry_builds_the_machines_wheels_within_its_travel_budget() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gpucheck", "carry"], cwd=ROOT, capture_output=True, text=True, timeout=1200
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "of 64 MiB" in done.stdout
    folder = ROOT / ".gpu-carry"
    manifest = json.loads((folder / carry.MANIFEST).read_text())
    assert manifest["python"] == carry.GPU_PYTHON == "3.12"
    wheels = sorted((folder / "wheels").glob("*.whl"))
    assert len(wheels) == len(carry.CARRIED)
    assert all(carry.installs_on(w.name, "3.12") for w in wheels)
    pytriton = next(w for w in wheels if w.name.startswith("nvidia_pytriton"))
    with zipfile.ZipFile(pytriton) as wheel:
        stubs = {n.split("/")[3] for n in wheel.namelist() if "/python_backend_stubs/" in n}
        assert "pytriton/tritonserver/bin/tritonserver" in wheel.namelist()
    assert stubs == {"3.12"}
    carried, tree = carry.check_budget(folder, ROOT)
    assert carried + tree <= carry.TRAVEL_LIMIT - carry.TREE_MARGIN


def test_the_gpu_checks_script_runs_here_on_the_cpu_and_its_report_adds_up(tmp_path: Path) -> None:
    out = tmp_path / "out"
    status, seconds = rehearse(out)
    log = (out / "gpu-check.log").read_text() if (out / "gpu-check.log").exists() else "(no log)"
    assert status == 0, log[-4000:]
    assert validate(out) == []
    document = json.loads((out / report.FIGURES).read_text())
    text = (out / report.REPORT).read_text()
    assert document["machine"]["device"] == "cpu" and document["compute_profile"]["device"] == "cpu"
    assert document["check"]["grid"]["name"] == "rehearsal"
    sections = document["sections"]
    latency = sections["latency"]["models"]
    assert set(latency) == {"recommender", "recommender_fp16", "image_classifier"}
    for name, model in latency.items():
        batches = model["batches"]
        assert list(batches) == ["1", "2", "4", "8"]
        assert all(p["client_ms"] > 0 and p["compute_ms"] > 0 and p["raw_ms"] > 0 for p in batches.values())
        assert f"**{name}**" in text
    assert all(m["ok"] for m in sections["parity"]["models"].values()), sections["parity"]
    assert sections["parity"]["models"]["recommender_fp16"]["limit"] == pytest.approx(2e-2)
    for point in sections["batching"]["points"]:
        assert point["none"]["failed"] == 0 and point["dynamic"]["failed"] == 0
        assert point["none"]["mean_batch"] == pytest.approx(1.0)  # no batcher: one request, one execution
    assert [r["instances"] for r in sections["instances"]["rows"]] == [1, 2]
    pipeline = {r["model"]: r for r in sections["pipeline"]["rows"]}
    fp16 = pipeline["image_classifier_pipeline_fp16"]
    assert fp16["boundary_bytes_per_row"] * 2 == fp16["boundary_fp32_bytes_per_row"] > 0
    shm = {r["transport"]: r for r in sections["shared_memory"]["rows"]}
    assert set(shm) == {"grpc", "system"} and all(r["correct"] for r in shm.values())
    assert "cuda: no CUDA device here" in text
    assert "GPU memory per instance and CUDA shared memory" in text  # not measured on a CPU, and said
    assert "drained: unloaded" in log  # stopped as `make serve` stops: its models unloaded before SIGTERM
    assert seconds > 0
