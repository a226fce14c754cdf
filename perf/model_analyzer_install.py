"""Install NVIDIA Triton Model Analyzer into a virtual environment of its own, beside the project's.

Model Analyzer (PyPI ``triton-model-analyzer``) pins a tritonclient, numpy and protobuf of its own,
none of which the project's ``.venv`` may take (nvidia-pytriton pins numpy < 2, the project its
tritonclient): so it gets ``<venv>/model-analyzer/``, a venv created with the running interpreter and
filled with ``pip``, as perf_analyzer gets ``<venv>/perf_analyzer/``. Nothing of it is imported here;
it is only ever run as a program (``<venv>/model-analyzer/bin/model-analyzer``). The witness command
(``make tune … TUNE_ARGS="--witness model-analyzer"``) installs it on first use; a stamp file records
the version installed, and a failed attempt writes its reason to ``UNAVAILABLE`` there so that tests
skip with it.

``python -m perf.model_analyzer_install [--force]``
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from perf.errors import PerfError

PACKAGE = "triton-model-analyzer"
VERSION = "1.58.0"
STAMP = ".installed"
INSTALL_TIMEOUT_S = 1200


class InstallError(PerfError, RuntimeError):
    """A step of the install failed; the message says which and why."""


def install_dir(prefix: Path | None = None) -> Path:
    """Where the install lives: ``<venv>/model-analyzer``."""
    return (prefix or Path(sys.prefix)) / "model-analyzer"


def executable(prefix: Path | None = None) -> Path:
    return install_dir(prefix) / "bin" / "model-analyzer"


def unavailable_reason(prefix: Path | None = None) -> str | None:
    """Why the last install attempt failed, if it did."""
    marker = install_dir(prefix) / "UNAVAILABLE"
    return marker.read_text().strip() if marker.is_file() else None


def installed_version(prefix: Path | None = None) -> str | None:
    """The version the stamp records, where the program is there too; else None."""
    stamp = install_dir(prefix) / STAMP
    if not (stamp.is_file() and executable(prefix).is_file()):
        return None
    return stamp.read_text().strip() or None


def _run(command: list[str]) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise InstallError(f"`{' '.join(command)}`: {error}") from error
    if done.returncode != 0:
        raise InstallError(f"`{' '.join(command)}` failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    return done.stdout


def probe(program: Path) -> str:
    """``model-analyzer --version``: the version it prints, or InstallError."""
    text = _run([str(program), "--version"]).strip()
    if not text:
        raise InstallError(f"{program} --version printed nothing")
    return text.splitlines()[-1]


def install(prefix: Path | None = None, force: bool = False) -> Path:
    """Install (or find installed) Model Analyzer; returns its program. Raises InstallError."""
    home = install_dir(prefix)
    if installed_version(prefix) == VERSION and not force:
        return executable(prefix)
    shutil.rmtree(home, ignore_errors=True)
    _run([sys._base_executable, "-m", "venv", str(home)])
    # --no-compile: its modules are compiled as they are first imported, not all of them at install
    _run([str(home / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
          "--no-compile", f"{PACKAGE}=={VERSION}"])  # fmt: skip
    found = probe(executable(prefix))
    if found != VERSION:
        raise InstallError(f"{PACKAGE}: asked for {VERSION}, {executable(prefix)} says {found}")
    (home / STAMP).write_text(VERSION + "\n")
    (home / "UNAVAILABLE").unlink(missing_ok=True)
    return executable(prefix)


def ensure(prefix: Path | None = None) -> Path:
    """``install``, writing the reason to ``UNAVAILABLE`` when it fails (and raising it again)."""
    try:
        return install(prefix)
    except (InstallError, OSError) as error:
        install_dir(prefix).mkdir(parents=True, exist_ok=True)
        (install_dir(prefix) / "UNAVAILABLE").write_text(f"{type(error).__name__}: {error}\n")
        raise InstallError(str(error)) from error


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m perf.model_analyzer_install", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--force", action="store_true", help="reinstall even if present")
    args = parser.parse_args(argv)
    try:
        program = install(force=True) if args.force else ensure()
    except InstallError as error:
        print(f"Model Analyzer not installed: {error}")
        return 1
    print(f"model-analyzer: {program} ({probe(program)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
