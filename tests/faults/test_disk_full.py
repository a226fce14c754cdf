"""Fault matrix row: a full disk never wedges the build.

The build runs on a small tmpfs filled to leave room for the files before one of the files it writes
and none (or half) for that file, for every file it writes (the marker, each model's ``model.onnx``,
``export.json`` and ``config.pbtxt``, a stage's ``stage.pt2``, the stage runner's helpers, the
ensemble's config, ``pipeline.json``). Each time it
must stop with one line naming the file, the free space and what the file needs (no traceback, no
SIGABRT from torch's zip writer), leave nothing half-written under a name a later build or the server
trusts, and the next build with room must complete. A damaged record (the 0-byte ``export.json`` a
full disk used to leave) means "rebuild", and a truncated text encoder is rebuilt, never "(cached)".
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import pytest
import yaml
from small_disk import MountUnavailableError, private_tmpfs

import python_backend
from exporters.__main__ import main as exporters_main
from exporters.artifacts.records import file_sha256
from exporters.configs.model_config import read_config

pytestmark = pytest.mark.integration

PAGE = 4096  # tmpfs allocates whole pages
DISK_BYTES = 64 << 20
DISK_FULL = re.compile(
    r"^error no space left to write (?P<path>\S+): [\d.]+ \w+ free on its file system, it needs [\d.]+ \w+$",
    re.MULTILINE,
)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB tmpfs: a disk that fills, gone with the process even where a killed run never tears
    it down (``small_disk.private_tmpfs``; mounting needs root: skipped where it cannot be mounted)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    working = Path.cwd()
    try:
        with private_tmpfs(mount, DISK_BYTES):
            yield mount
    except MountUnavailableError as error:
        pytest.skip(f"cannot mount a small tmpfs to fill (needs root): {error}")
    # the tests after this one in the process read paths relative to it (a spec, a module to run)
    assert Path.cwd() == working, "the small disk left the tests in another working folder"


# A process that holds a small disk until it is killed (argv: this folder, the mount point).
HOLD_SMALL_DISK = """
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from small_disk import MountUnavailableError, private_tmpfs
try:
    with private_tmpfs(Path(sys.argv[2]), 1 << 20):
        print("mounted", flush=True)
        time.sleep(600)
except MountUnavailableError as error:
    print("unavailable:", error, flush=True)
"""


def _mounted(path: Path, pid: int) -> bool:
    """Whether the mount namespace of process ``pid`` has a mount at ``path``."""
    lines = Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
    return any(line.split()[4] == str(path) for line in lines)


def test_a_killed_run_leaves_no_small_disk_mounted(tmp_path: Path) -> None:
    """The small disk is mounted only where the process that mounted it looks: killed before any
    teardown, it leaves no tmpfs (and no filler's RAM) behind in the namespace the tests run in."""
    mount = tmp_path / "disk"
    mount.mkdir()
    command = [sys.executable, "-c", HOLD_SMALL_DISK, str(Path(__file__).parent), str(mount)]
    holder = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        ready = holder.stdout.readline()
        if ready.startswith("unavailable"):
            pytest.skip(f"cannot mount a small tmpfs to fill (needs root): {ready.strip()}")
        assert ready == "mounted\n" and _mounted(mount, holder.pid)
        assert not _mounted(mount, os.getpid()), "the small disk is mounted in the tests' namespace"
    finally:
        holder.kill()
        holder.wait()
    assert not _mounted(mount, os.getpid())


def test_the_small_disk_gives_back_the_namespace_and_the_working_folder(tmp_path: Path) -> None:
    """Leaving the private namespace put the thread in that namespace's root folder: every later test in
    the process that reads a path relative to the checkout (``models.yaml``, ``python -m server``) failed."""
    mount, namespace, working = tmp_path / "disk", os.readlink("/proc/thread-self/ns/mnt"), Path.cwd()
    mount.mkdir()
    try:
        with private_tmpfs(mount, 1 << 20):
            assert os.readlink("/proc/thread-self/ns/mnt") != namespace
    except MountUnavailableError as error:
        pytest.skip(f"cannot mount a small tmpfs to fill (needs root): {error}")
    assert (os.readlink("/proc/thread-self/ns/mnt"), Path.cwd()) == (namespace, working)


def _leave_free(disk: Path, free: int) -> None:
    """Fill ``disk`` so that exactly ``free`` bytes (whole pages) are left."""
    filler = disk / "filler"
    filler.unlink(missing_ok=True)
    size = shutil.disk_usage(disk).free - free
    if size > 0:
        descriptor = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.posix_fallocate(descriptor, 0, size)
        finally:
            os.close(descriptor)
    assert shutil.disk_usage(disk).free == free


@pytest.fixture
def spec_file(spec_data: dict[str, Any], tmp_path: Path) -> Path:
    """trivial, a small recommender and its embedding/dense pipeline (a ``.pt2`` stage and the stage
    runner's files) from ``models.yaml``; small tables keep each of the many builds short."""
    data = copy.deepcopy(spec_data)
    data["models"] = [m for m in data["models"] if m["name"] in ("trivial", "recommender")]
    recommender = next(m for m in data["models"] if m["name"] == "recommender")
    recommender["options"] = {"table_sizes": [100] * 8, "embedding_dim": 8, "bottom": [32], "top": [32]}
    next(t for t in recommender["inputs"] if t["name"] == "sparse_ids")["range"] = [0, 100]
    data["pipelines"] = [p for p in data["pipelines"] if p["name"] == "recommender_pipeline"]
    data.pop("text_embeddings", None)
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _build(spec: Path, repository: Path, capsys: pytest.CaptureFixture) -> tuple[int, str]:
    code = exporters_main(["build", "--spec", str(spec), "--repository", str(repository), "--gpus", "0"])
    return code, capsys.readouterr().out


def _files(folder: Path) -> list[Path]:
    return [path for path in folder.rglob("*") if path.is_file()]


def assert_nothing_half_written(repository: Path) -> None:
    """Every file under a name the build or the server trusts is whole; no temporary is left."""
    if not repository.exists():
        return
    installed = (
        *python_backend.TORCH_STAGE,
        *python_backend.TEXT_TOKENIZER,
        *python_backend.ONNXRUNTIME_BACKEND,
    )
    sources = [python_backend.HERE / name for name in installed]
    for path in _files(repository):
        where = path.relative_to(repository)
        assert "partial" not in path.name, f"{where}: a temporary was left behind"
        if path.suffix == ".json" or path.name == ".built-by-triton-batching":
            json.loads(path.read_text())  # never empty or cut short
        elif path.name == "config.pbtxt":
            read_config(path)
        elif path.suffix == ".onnx":
            onnx.checker.check_model(str(path))
        elif path.suffix == ".pt2":
            with zipfile.ZipFile(path) as archive:  # the build's own archive, whole: every entry's CRC holds
                assert archive.testzip() is None, where
        elif path.suffix == ".py":  # a copy of one of the python_backend files, whole
            assert path.read_bytes() in [s.read_bytes() for s in sources if s.name == path.name], where
    for record in repository.rglob("export.json"):
        artifact = record.parent / "model.onnx"
        sha256 = json.loads(record.read_text())["file_sha256"]
        assert artifact.is_file() and file_sha256(artifact) == sha256, f"{record} describes another file"


def _free_space_points(reference: Path) -> list[tuple[int, Path]]:
    """(pages to leave free, the file the build should run out of room in): for each file of the
    reference build, room for the files written before it and none (or, for a file of several pages,
    half of it) for it. Files are written whole and renamed into place, so their change times give
    the order; the stage runner's helpers, copied one after another, count once."""
    files = sorted(_files(reference), key=lambda p: p.stat().st_ctime_ns)
    points, seen, before = [], set(), 0
    for path in files:
        pages = math.ceil(path.stat().st_size / PAGE)
        kind = (path.parent, path.suffix)
        if kind not in seen:
            seen.add(kind)
            points += [(before + share, path.relative_to(reference)) for share in sorted({0, pages // 2})]
        before += pages
    return points


def test_a_full_disk_stops_the_build_with_one_clear_error_and_the_next_build_heals(
    small_disk: Path,
    spec_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # the CLI's console: one message, one line
    reference = tmp_path / "reference"
    assert _build(spec_file, reference, capsys)[0] == 0
    expected = sorted(p.relative_to(reference) for p in _files(reference))
    repository = small_disk / "repository"
    stopped_at = []
    for pages, target in _free_space_points(reference):
        shutil.rmtree(repository, ignore_errors=True)
        _leave_free(small_disk, pages * PAGE)
        code, out = _build(spec_file, repository, capsys)
        assert "Traceback" not in out
        if code != 0:
            found = DISK_FULL.search(out)
            assert code == 1 and found, f"with room for the files before {target}: {out}"
            stopped_at.append(Path(found["path"]).relative_to(repository))
        assert_nothing_half_written(repository)
        (small_disk / "filler").unlink()
        code, out = _build(spec_file, repository, capsys)
        assert code == 0, f"the build after a full disk (at {target}) failed: {out}"
        assert_nothing_half_written(repository)
        assert sorted(p.relative_to(repository) for p in _files(repository)) == expected
    assert len(set(stopped_at)) >= 10, (
        f"the sweep stopped the build at too few files: {sorted(set(stopped_at))}"
    )
    assert {"stage.pt2", "model.onnx", "export.json", "config.pbtxt"} <= {p.name for p in stopped_at}


def test_a_damaged_build_record_means_rebuild_not_a_crash(
    spec_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The 0-byte ``export.json`` a full disk left made every later build fail with JSONDecodeError."""
    repository = tmp_path / "repository"
    assert _build(spec_file, repository, capsys)[0] == 0
    (repository / "recommender" / "1" / "export.json").write_text("")
    (repository / "trivial" / "1" / "export.json").write_text("[1, 2]")
    (repository / "recommender_pipeline" / "pipeline.json").write_text('{"content_hash": ')
    (repository / ".built-by-triton-batching").write_text("\0\0\0")
    code, out = _build(spec_file, repository, capsys)
    assert code == 0, out
    assert_nothing_half_written(repository)
    for record in (
        "recommender/1/export.json",
        "trivial/1/export.json",
        "recommender_pipeline/pipeline.json",
    ):
        assert json.loads((repository / record).read_text())["content_hash"]


def test_a_truncated_text_encoder_is_rebuilt_not_reported_cached(
    spec_data: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "1000")
    data = {
        "models": [m for m in spec_data["models"] if m["name"] == "trivial"],
        "text_embeddings": [{"name": "text_embedding"}],
    }
    spec = tmp_path / "models.yaml"
    spec.write_text(yaml.safe_dump(data))
    repository = tmp_path / "repository"
    encoder = repository / "text_embedding_encoder" / "1" / "model.onnx"
    code, out = _build(spec, repository, capsys)
    assert code == 0 and "(cached)" not in out, out
    whole = encoder.read_bytes()
    assert "(cached)" in _build(spec, repository, capsys)[1]  # untouched: a real cache hit
    encoder.write_bytes(whole[: len(whole) // 2])
    code, out = _build(spec, repository, capsys)
    assert code == 0 and "(cached)" not in out, "a truncated text encoder was reported cached"
    assert encoder.read_bytes() == whole
    assert_nothing_half_written(repository)
