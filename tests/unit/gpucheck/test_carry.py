"""``make gpu-carry``'s rules without PyPI: a wheel installs on the Pythons its tags name, the trimmed
PyTriton keeps the server and only the target Python's stub, and a carry over the travel budget names
its largest files (docs/GPU.md)."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest

from gpucheck import carry

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
