"""The GPU check's parts that need no server: the carried folder's rules, the import rule, the
compute profile's shape, and the output checks the rehearsal applies (docs/GPU.md)."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from gpucheck import carry, report
from gpucheck.grid import GPU, REHEARSAL
from gpucheck.raw import RawCurve
from gpucheck.rehearsal import closure, validate
from perf.model.latency import fit_latency

ROOT = Path(__file__).resolve().parents[3]
VERSIONS = ("3.11", "3.12", "3.13")


@pytest.mark.parametrize(
    ("wheel", "python", "installs"),
    [
        ("grpcio-1.85.3-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl", "3.12", True),
        ("grpcio-1.85.3-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl", "3.12", False),
        ("protobuf-6.33.6-cp39-abi3-manylinux2014_x86_64.whl", "3.12", True),
        ("protobuf-6.33.6-cp39-abi3-manylinux2014_x86_64.whl", "3.8", False),
        ("tritonclient-2.73.0-py3-none-any.whl", "3.11", True),
        ("nvidia_pytriton-0.7.0-py3-none-manylinux_2_35_x86_64.whl", "3.12", True),
    ],
)
def test_a_wheel_installs_on_the_pythons_its_tags_name(wheel: str, python: str, installs: bool) -> None:
    assert carry.installs_on(wheel, python) is installs


def _fake_pytriton(path: Path) -> Path:
    names = [
        "pytriton/__init__.py",
        "pytriton/tritonserver/bin/tritonserver",
        "pytriton/tritonserver/backends/python/libtriton_python.so",
        *(f"pytriton/tritonserver/python_backend_stubs/{v}/triton_python_backend_stub" for v in VERSIONS),
        "nvidia_pytriton.libs/libtritonserver-1.so",
        "nvidia_pytriton.libs/libpython3-2.13.so.1.0",
    ]  # fmt: skip
    record = "nvidia_pytriton-0.7.0.dist-info/RECORD"
    with zipfile.ZipFile(path, "w") as wheel:
        for name in names:
            wheel.writestr(name, f"bytes of {name}")
        wheel.writestr(record, "".join(f"{n},sha256=x,9\n" for n in [*names, record]))
    return path


def test_the_trimmed_pytriton_keeps_the_server_and_only_the_target_pythons_stub(tmp_path: Path) -> None:
    source = _fake_pytriton(tmp_path / "nvidia_pytriton-0.7.0-py3-none-manylinux_2_35_x86_64.whl")
    out = tmp_path / "out"
    out.mkdir()
    trimmed = carry.trim_pytriton(source, "3.12", out)
    with zipfile.ZipFile(trimmed) as wheel:
        names = set(wheel.namelist())
        record = wheel.read("nvidia_pytriton-0.7.0.dist-info/RECORD").decode()
        kept = wheel.read("pytriton/tritonserver/bin/tritonserver")
    assert "pytriton/tritonserver/python_backend_stubs/3.12/triton_python_backend_stub" in names
    assert not any("/3.11/" in n or "/3.13/" in n or "libpython" in n for n in names)
    assert (
        "pytriton/tritonserver/bin/tritonserver" in names
        and kept == b"bytes of pytriton/tritonserver/bin/tritonserver"
    )
    assert {line.split(",")[0] for line in record.splitlines()} == names  # RECORD lists exactly what is there
    with pytest.raises(carry.CarryError, match=r"no Python-backend stub for Python 3\.9"):
        carry.trim_pytriton(source, "3.9", out)


def test_a_carry_over_the_travel_budget_names_its_largest_files(tmp_path: Path) -> None:
    folder = tmp_path / "carry"
    (folder / "wheels").mkdir(parents=True)
    (folder / "wheels" / "big.whl").write_bytes(b"\0" * (3 << 20))
    (folder / "wheels" / "small.whl").write_bytes(b"\0" * 10)
    checkout = tmp_path / "checkout"  # a working tree whose one untracked file is sized as asked (sparse)
    checkout.mkdir()
    subprocess.run(["git", "init", "-q", str(checkout)], check=True)
    with open(checkout / "data.bin", "wb") as tree_file:
        tree_file.truncate(carry.TRAVEL_LIMIT - (4 << 20))
    with pytest.raises(carry.CarryError, match=r"(?s)leaves less than 2 MiB.*3\.0 MiB  wheels/big\.whl"):
        carry.check_budget(folder, checkout)
    with open(checkout / "data.bin", "wb") as tree_file:
        tree_file.truncate(1 << 20)
    assert carry.check_budget(folder, checkout) == ((3 << 20) + 10, 1 << 20)


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_the_check_imports_nothing_the_gpu_machine_lacks() -> None:
    """``gpucheck.run`` and everything it imports, and finding the server: neither pydantic nor
    PyTriton's Python API (nor what that needs) is loaded; the GPU machine has neither (DESIGN.md §3).
    The rehearsal proves it again with nothing else on ``sys.path``."""
    code = (
        "import sys\n"
        "import gpucheck.run, gpucheck.rehearsal\n"
        "from server.install import find_install\n"
        "find_install()\n"
        "lacking = {'pydantic', 'pydantic_core', 'pytriton', 'zmq', 'sh', 'typer'}\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & lacking))\n"
    )
    assert _run(code) == "[]"


def test_finding_the_wheels_tritonserver_does_not_import_pytriton() -> None:
    code = "import sys; import server.install as s; s.find_install(); print('pytriton' in sys.modules)"
    assert _run(code) == "False"


def test_the_rehearsal_stands_in_only_the_gpu_machines_packages() -> None:
    names = {d.metadata["Name"].lower().replace("_", "-") for d in closure(("torch", "onnx"))}
    assert {"torch", "onnx", "numpy"} <= names
    assert not names & {"pydantic", "nvidia-pytriton", "tritonclient", "protobuf"}  # carried or absent there


def _curve(base: str, precision: str, points: dict[int, float]) -> RawCurve:
    return RawCurve(base, precision, "cpu", points, fit_latency(points))


def test_the_compute_profile_is_the_fit_of_raw_torch_per_model_and_precision() -> None:
    curves = [
        _curve("recommender", "fp32", {1: 1.0, 2: 1.5, 4: 2.5}),
        _curve("recommender", "fp16", {1: 0.5, 8: 4.0}),
    ]
    profile = report.compute_profile("NVIDIA H200", curves)
    assert profile["device"] == "NVIDIA H200" and "raw torch" in profile["source"]
    fp32 = profile["models"]["recommender"]["fp32"]
    assert fp32["T_ms"] == pytest.approx(1.0) and fp32["dt_ms"] == pytest.approx(0.5)
    assert fp32["batches"] == {"1": 1.0, "2": 1.5, "4": 2.5}
    assert set(profile["models"]["recommender"]) == {"fp32", "fp16"}


def test_the_grids_fit_the_lent_machine() -> None:
    """The GPU grid measures batch 1…256 at concurrency 1/16/64 and 1, 2, 4 instances, stopping early
    enough to write its report inside the eight minutes the check has; the rehearsal is tiny."""
    assert GPU.batches[0] == 1 and GPU.max_batch == 256 and GPU.concurrencies == (1, 16, 64)
    assert GPU.instances == (1, 2, 4) and len(GPU.latency_models) == 4 and len(GPU.pipelines) == 2
    assert GPU.deadline_s < 8 * 60 - 60
    assert REHEARSAL.max_batch <= 8 and len(REHEARSAL.instances) >= 2


def _document(sections: dict) -> dict:
    from gpucheck.machine import MachineFacts

    facts = MachineFacts(
        "3.12.3", "2.11.0", "13.0", "2.5.2", "1.30.0", ["CPUExecutionProvider"], "NVIDIA H200", True
    )
    raw = {("recommender", "fp32"): _curve("recommender", "fp32", {1: 1.0, 2: 1.5})}
    return report.figures(GPU, facts, sections, raw, 12.0)


def test_a_report_with_failed_and_skipped_steps_still_renders_and_says_so(tmp_path: Path) -> None:
    sections = {
        "raw": {"status": "ok", "seconds": 1.0, "curves": []},
        "server": {"status": "failed", "error": "ServingError: recommender did not load", "seconds": 3.0},
        "latency": {"status": "skipped", "reason": "needs server, which did not run"},
    }
    report.write(tmp_path, _document(sections))
    text = (tmp_path / report.REPORT).read_text()
    assert "recommender did not load" in text and "Not measured: skipped." in text
    assert "TensorRT FP16 plans" in text and "onnxruntime's CUDA execution provider" in text
    problems = validate(tmp_path)
    assert any("server: failed" in p for p in problems) and any("latency: skipped" in p for p in problems)
    document = json.loads((tmp_path / report.FIGURES).read_text())
    assert document["compute_profile"]["models"]["recommender"]["fp32"]["batches"] == {"1": 1.0, "2": 1.5}


def test_validate_refuses_more_files_than_come_back_and_a_malformed_profile(tmp_path: Path) -> None:
    report.write(tmp_path, _document({"raw": {"status": "ok", "seconds": 1.0}}))
    assert validate(tmp_path) == []
    figures = json.loads((tmp_path / report.FIGURES).read_text())
    del figures["compute_profile"]["models"]["recommender"]["fp32"]["dt_ms"]
    (tmp_path / report.FIGURES).write_text(json.dumps(figures))
    for extra in range(4):
        (tmp_path / f"extra{extra}.txt").write_text("x")
    problems = validate(tmp_path)
    assert any("the device tool brings back 8" in p for p in problems)
    assert any("is not {T_ms, dt_ms, batches}" in p for p in problems)
