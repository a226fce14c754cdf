"""``make gpu-carry``: the ignored folder of wheels the GPU check needs and the lent machine (Python 3.12,
offline, 64 MiB carried) lacks, at the versions the ``.venv`` runs: tritonclient with its stacks
(protobuf and grpcio too: its generated code refuses older ones), nvidia-pytriton trimmed to one stub,
and a stripped libpython for a machine whose Python is static."""

from __future__ import annotations

import argparse
import gzip
import importlib.metadata
import json
import logging
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

log = logging.getLogger(__name__)

MIB = 1 << 20
TRAVEL_LIMIT = 64 * MIB  # what one device command may take along: the working tree plus carried folders
TREE_MARGIN = 2 * MIB  # room for the working tree to grow before the carry has to shrink
PYTRITON = "nvidia-pytriton"
# Distributions the check imports that the lent machine lacks or may hold in too old a version.
CARRIED = (
    PYTRITON, "tritonclient", "protobuf", "grpcio", "python-rapidjson", "geventhttpclient", "gevent",
    "greenlet", "zope.event", "zope.interface", "brotli",
)  # fmt: skip
# pip matches manylinux tags exactly: every one the carried wheels use (the machine's glibc is newer).
PLATFORMS = (
    *(f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35)),
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
GPU_PYTHON = "3.12"  # the lent machine's python3
MANIFEST = "MANIFEST.json"


class CarryError(RuntimeError):
    """The carried folder cannot be built, or does not fit; the message says what to do."""


def pinned_versions() -> dict[str, str]:
    """Each carried distribution at the version the ``.venv`` runs: both sides import the same code."""
    versions = {}
    for name in CARRIED:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError as error:
            raise CarryError(f"{name} is not installed here; run `make setup` first") from error
    return versions


def download(versions: dict[str, str], python_version: str, folder: Path) -> list[Path]:
    """``pip download`` each pinned wheel for ``python_version`` on x86-64 Linux into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
        "--only-binary=:all:", "--python-version", python_version, "--implementation", "cp",
        *(arg for platform in PLATFORMS for arg in ("--platform", platform)), "-d", str(folder),
        *(f"{name}=={version}" for name, version in versions.items()),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise CarryError(f"pip download failed (needs PyPI):\n{done.stderr[-3000:]}")
    wheels = []
    for name, version in versions.items():
        found = _wheel_of(folder, name, version, python_version)
        if found is None:
            raise CarryError(f"pip download left no wheel of {name}=={version} in {folder}")
        wheels.append(found)
    return wheels


def installs_on(wheel_name: str, python_version: str) -> bool:
    """Whether a wheel (by its file name's tags) installs on CPython ``python_version`` (``pip download``
    picked the platform)."""
    target = tuple(int(part) for part in python_version.split("."))
    supported = {(t.interpreter, t.abi) for t in (*cpython_tags(target), *compatible_tags(target))}
    return any((tag.interpreter, tag.abi) in supported for tag in parse_wheel_filename(wheel_name)[3])


def _wheel_of(folder: Path, name: str, version: str, python_version: str) -> Path | None:
    for wheel in sorted(folder.glob("*.whl")):
        found, found_version, _, _ = parse_wheel_filename(wheel.name)
        same = found == canonicalize_name(name) and found_version == Version(version)
        if same and installs_on(wheel.name, python_version):
            return wheel
    return None


def _drop_from_pytriton(name: str, python_version: str) -> bool:
    """Other Pythons' stubs and the libpython one of them bundles: a third of the wheel, never run there."""
    if name.startswith("pytriton/tritonserver/python_backend_stubs/"):
        return name.split("/")[3] != python_version
    return name.startswith("nvidia_pytriton.libs/libpython")


def trim_pytriton(wheel: Path, python_version: str, destination: Path) -> Path:
    """``wheel`` without what ``_drop_from_pytriton`` names, its ``RECORD`` rewritten to match."""
    target = destination / wheel.name
    with (
        zipfile.ZipFile(wheel) as source,
        zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as out,
    ):
        kept = [i for i in source.infolist() if not _drop_from_pytriton(i.filename, python_version)]
        stubs = [i for i in kept if i.filename.startswith("pytriton/tritonserver/python_backend_stubs/")]
        if not stubs:
            raise CarryError(f"{wheel.name} has no Python-backend stub for Python {python_version}")
        for info in kept:
            data = source.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                names = {i.filename for i in kept}
                lines = [line for line in data.decode().splitlines() if line.split(",")[0] in names]
                data = ("\n".join(lines) + "\n").encode()
            out.writestr(info, data)
    return target


def _strip(library: Path, destination: Path) -> None:
    """``library`` without its symbols (a third of its size), gzipped."""
    plain = destination.with_suffix("")
    shutil.copyfile(library, plain)
    if shutil.which("strip"):
        subprocess.run(["strip", "--strip-unneeded", str(plain)], check=False, capture_output=True)
    with open(plain, "rb") as source, gzip.open(destination, "wb", compresslevel=9) as out:
        shutil.copyfileobj(source, out)
    plain.unlink()


def local_libpython(python_version: str) -> Path | None:
    """A shared ``libpython<version>.so.1.0`` of a Python installed here (pyenv or the system), if any."""
    soname = f"libpython{python_version}.so.1.0"
    candidates = [Path(sys.base_prefix) / "lib" / soname]
    candidates += sorted(Path.home().glob(f".pyenv/versions/{python_version}*/lib/{soname}"))
    candidates += [Path("/usr/lib/x86_64-linux-gnu") / soname, Path("/usr/local/lib") / soname]
    return next((c for c in candidates if c.is_file()), None)


def working_tree_bytes(root: Path) -> int:
    """What travels of the checkout: tracked files plus untracked ones git does not ignore."""
    listing = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout
    paths = (root / name.decode() for name in filter(None, listing.split(b"\0")))
    return sum(path.stat().st_size for path in paths if path.is_file() and not path.is_symlink())


def folder_files(folder: Path) -> dict[Path, int]:
    """Every file under ``folder`` with its size, largest first (what the budget names)."""
    sizes = {path: path.stat().st_size for path in folder.rglob("*") if path.is_file()}
    return dict(sorted(sizes.items(), key=lambda item: -item[1]))


def _listed(destination: Path) -> dict[str, int]:
    files = folder_files(destination)
    return {str(path.relative_to(destination)): size for path, size in files.items() if path.name != MANIFEST}


def _up_to_date(destination: Path, wanted: dict) -> bool:
    try:
        manifest = json.loads((destination / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return manifest == {**wanted, "files": _listed(destination)}


def build_carry(
    destination: Path, python_version: str = GPU_PYTHON, downloads: Path = Path(".run/gpu-downloads")
) -> Path:
    versions = pinned_versions()
    wanted = {"python": python_version, "versions": versions}
    if _up_to_date(destination, wanted):
        log.info("%s is up to date", destination)
        return destination
    wheels_folder = destination / "wheels"
    if destination.exists():
        shutil.rmtree(destination)
    wheels_folder.mkdir(parents=True)
    for wheel in download(versions, python_version, downloads):
        if parse_wheel_filename(wheel.name)[0] == PYTRITON:
            trim_pytriton(wheel, python_version, wheels_folder)
        else:
            shutil.copy2(wheel, wheels_folder / wheel.name)
    library = local_libpython(python_version)
    if library is not None:
        (destination / "libpython").mkdir()
        _strip(library, destination / "libpython" / f"{library.name}.gz")
    else:
        log.warning(
            "no shared libpython%s here: the check will need the GPU machine's own (its stub links it)",
            python_version,
        )
    manifest = {**wanted, "files": _listed(destination)}
    (destination / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return destination


def check_budget(destination: Path, root: Path) -> tuple[int, int]:
    """``(carried bytes, working tree bytes)``; over budget, ``CarryError`` names the largest files."""
    files = folder_files(destination)
    carried = sum(files.values())
    tree = working_tree_bytes(root)
    if carried + tree > TRAVEL_LIMIT - TREE_MARGIN:
        largest = "\n".join(
            f"  {size / MIB:6.1f} MiB  {path.relative_to(destination)}"
            for path, size in list(files.items())[:6]
        )
        raise CarryError(
            f"{destination} ({carried / MIB:.1f} MiB) plus the working tree ({tree / MIB:.1f} MiB) leaves "
            f"less than {TREE_MARGIN / MIB:.0f} MiB of the {TRAVEL_LIMIT / MIB:.0f} MiB a device command "
            f"carries. Largest carried files:\n{largest}\nDrop one the check can do without (e.g. a "
            "package whose version the machine already has: CARRIED in gpucheck/carry.py), or shrink the "
            "working tree"
        )
    return carried, tree


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="python -m gpucheck carry", description=__doc__).parse_args(argv)
    destination = Path(".gpu-carry")
    try:
        build_carry(destination)
        carried, tree = check_budget(destination, Path.cwd())
    except CarryError as error:
        print(f"gpu-carry: {error}", file=sys.stderr)
        return 1
    for path, size in folder_files(destination).items():
        print(f"  {size / MIB:7.2f} MiB  {path.relative_to(destination)}")
    left = TRAVEL_LIMIT - carried - tree
    print(
        f"{destination}: {carried / MIB:.1f} MiB for Python {GPU_PYTHON}; with the working tree "
        f"({tree / MIB:.1f} MiB) {(carried + tree) / MIB:.1f} of {TRAVEL_LIMIT / MIB:.0f} MiB "
        f"({left / MIB:.1f} MiB left)"
    )
    return 0
