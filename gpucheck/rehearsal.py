"""``make gpu-rehearsal``: the GPU check's own script on this CPU (tiny grid, ``KIND_CPU``), under a fresh
virtual environment holding only the carried wheels and ``MACHINE_PACKAGES`` linked from the ``.venv``:
a check that imports anything the GPU machine lacks fails here first."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import time
import venv
from pathlib import Path

from gpucheck.carry import CARRIED, build_carry

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".run" / "gpu-rehearsal"
DOWNLOADS = ROOT / ".run" / "gpu-downloads"
# What the GPU machine's python3 has (DESIGN.md §3) and the check imports, with their requirements;
# onnxruntime-gpu is this .venv's onnxruntime
MACHINE_PACKAGES = (
    "torch", "numpy", "onnx", "onnxruntime-gpu", "pyyaml", "matplotlib", "aiohttp", "tqdm", "rich",
    "packaging", "urllib3", "certifi", "ml-dtypes", "typing-extensions",
)  # fmt: skip
MAX_FILES = 8  # what the device tool brings back from $OUT


def closure(roots: tuple[str, ...]) -> list[importlib.metadata.Distribution]:
    """``roots`` and every distribution they require (no extras), as installed here, less the carried ones."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    skip = {canonicalize_name(name) for name in CARRIED}
    seen: dict[str, importlib.metadata.Distribution] = {}
    pending = [canonicalize_name(root) for root in roots]
    while pending:
        name = pending.pop()
        if name in seen or name in skip:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # an optional platform package this environment never installed
        seen[name] = dist
        for requirement in map(Requirement, dist.requires or ()):
            # a marker evaluates with no extra asked for: a requirement of an extra does not apply
            if requirement.marker is None or requirement.marker.evaluate():
                pending.append(canonicalize_name(requirement.name))
    return list(seen.values())


def link_packages(dists: list[importlib.metadata.Distribution], folder: Path) -> None:
    """Link every top-level file and folder of ``dists`` into ``folder``: the machine's packages alone."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for dist in dists:
        base = Path(str(dist.locate_file("")))
        tops = {Path(str(f)).parts[0] for f in dist.files or () if not str(f).startswith("..")}
        for top in sorted(tops):
            source, target = base / top, folder / top
            wanted = top not in ("bin", "__pycache__") and not target.exists()
            if wanted and (source.exists() or source.is_symlink()):
                target.symlink_to(source.resolve(), target_is_directory=source.is_dir())


def validate(out: Path) -> list[str]:
    """What is wrong with a run's output (empty when nothing); its profile read as ``make plan`` does."""
    from gpucheck import report
    from perf.errors import OptionError
    from perf.plan.compute_profile import read_compute_profile

    problems = []
    files = [p for p in out.rglob("*") if p.is_file()]
    if len(files) > MAX_FILES:
        problems.append(f"{len(files)} files in {out}; the device tool brings back {MAX_FILES}")
    missing = [name for name in (report.REPORT, report.FIGURES, *report.PLOTS) if not (out / name).is_file()]
    problems += [f"{name} is missing" for name in missing]
    if missing:
        return problems
    document = json.loads((out / report.FIGURES).read_text())
    text = (out / report.REPORT).read_text()
    try:
        fits = read_compute_profile(out / report.FIGURES).models
    except OptionError as error:
        problems.append(str(error))
        fits = {}
    for model, by_precision in fits.items():
        for precision, fit in by_precision.items():
            if f"{fit.T_ms:.4f}" not in text:
                problems.append(f"the report does not show {model} {precision}'s T ({fit.T_ms:.4f} ms)")
    for name, section in document.get("sections", {}).items():
        if section.get("status") != "ok":
            problems.append(
                f"section {name}: {section.get('status')} {section.get('error') or section.get('reason')}"
            )
    for item in document.get("not_measured", []):
        if item["what"] not in text:
            problems.append(f"the report does not list what it did not measure: {item['what']}")
    return problems


def rehearse(out: Path, work: Path = WORK) -> tuple[int, float]:
    """Run the check's script here; ``(exit status, seconds)``."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    carried = build_carry(work / "carry", version, DOWNLOADS)
    machine_site = work / "machine-site"
    link_packages(closure(MACHINE_PACKAGES), machine_site)
    python = work / "python" / "bin" / "python"
    if not python.exists():  # a virtual environment of this Python with nothing but pip, made once
        venv.EnvBuilder(with_pip=True, clear=True, symlinks=True).create(work / "python")
    if out.exists():
        shutil.rmtree(out)
    environment = {
        **{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")},
        "PYTHON": str(python.absolute()),
        "PYTHONPATH": str(machine_site.resolve()),
        "GPU_CARRY": str(carried.resolve()),
        "GRID": "rehearsal",
        "OUT": str(out.resolve()),
    }
    began = time.monotonic()
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], env=environment, cwd=ROOT)
    return done.returncode, time.monotonic() - began


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="python -m gpucheck rehearse", description=__doc__).parse_args(argv)
    out = WORK / "out"
    status, seconds = rehearse(out)
    problems = validate(out)
    for problem in problems:
        print(f"gpu-rehearsal: {problem}", file=sys.stderr)
    print(f"gpu-rehearsal: the check's script ran {seconds:.0f} s here, exit {status}; output in {out}")
    return status or (1 if problems else 0)
