"""The parent's side of an outside archive: its signature and its ONNX conversion, made in the sandbox.
The bytes bound into the sandbox are the bytes hashed, so the file cannot change between hash and load;
what comes back is parsed as untrusted data. Results are cached per archive hash and request
(``cache_root``), each file with its SHA-256, so build, ``infer --check`` and perf share one conversion."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from exporters.artifacts.records import file_matches, file_sha256, read_record
from exporters.errors import SpecError
from exporters.sandbox import child
from exporters.sandbox.child import (
    ARRAYS,
    ERROR,
    FOUND,
    ONNX,
    OUTPUTS,
    PROGRAM,
    REQUEST,
    USER_ERROR,
    ProgramTensor,
    from_json,
)
from exporters.sandbox.jail import Bounds, SandboxRunError, failure, run_in_sandbox

log = logging.getLogger(__name__)

CONVERTER_VERSION = "1"  # bump when the child's conversion changes, to invalidate cached conversions
CACHE_ENV = "TRITON_BATCHING_CACHE"
RECORD = "record.json"
CHILD = "exporters.sandbox.child"
MAX_PROBLEM = 600  # characters of a reason the sandbox gives


def _shown(text: str) -> str:
    """Text the sandbox sent, fit for a one-line message: printable and at most ``MAX_PROBLEM`` long."""
    return "".join(c if c.isprintable() else " " for c in text)[:MAX_PROBLEM]


def cache_root() -> Path:
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "triton-batching"


class OutsideArchive:
    """An archive the user brought: opened only in the sandbox; ``field`` names it in errors."""

    def __init__(self, path: Path, field: str) -> None:
        if not path.is_file():
            raise SpecError(field, f"no such file: {path}")
        self.path, self.field = path, field
        self.data = path.read_bytes()
        self.sha256 = hashlib.sha256(self.data).hexdigest()
        self.bounds = Bounds.from_environment()

    def describe(self) -> tuple[list[ProgramTensor], list[ProgramTensor]]:
        key = self._key("describe")
        folder = self._cached(key, (FOUND,)) or self._run("describe", {}, key, (FOUND,))
        return from_json((folder / FOUND).read_bytes())

    def convert(
        self, input_names: list[str], output_names: list[str], sets: list[list[np.ndarray]]
    ) -> tuple[Path, list[list[np.ndarray]]]:
        """The program as an fp32 ONNX file with these tensor names, and its outputs for each of ``sets``."""
        buffer = io.BytesIO()
        np.savez(buffer, **{f"{k}_{i}": a for k, arrays in enumerate(sets) for i, a in enumerate(arrays)})
        request = json.dumps({"inputs": input_names, "outputs": output_names}).encode()
        key = self._key("convert", request, buffer.getvalue())
        names = (FOUND, ONNX, OUTPUTS)
        extra = {REQUEST: request, ARRAYS: buffer.getvalue()}
        folder = self._cached(key, names) or self._run("convert", extra, key, names)
        with np.load(folder / OUTPUTS, allow_pickle=False) as arrays:
            count = len(output_names)
            return folder / ONNX, [
                [np.asarray(arrays[f"{k}_{j}"]) for j in range(count)] for k in range(len(sets))
            ]

    def _key(self, mode: str, *parts: bytes) -> str:
        digest = hashlib.sha256(f"{CONVERTER_VERSION}\0{torch.__version__}\0{mode}\0{self.sha256}".encode())
        for part in parts:
            digest.update(hashlib.sha256(part).digest())
        return digest.hexdigest()

    def _cached(self, key: str, names: tuple[str, ...]) -> Path | None:
        folder = cache_root() / "outside-archives" / key
        record = read_record(folder / RECORD) or {}
        return folder if all(file_matches(folder / n, record.get(n)) for n in names) else None

    def _run(self, mode: str, extra: dict[str, bytes], key: str, names: tuple[str, ...]) -> Path:
        """Run the child on a private copy of the archive; its frames, exactly ``names``, become cache key."""
        what = f"{self.field}: opening {self.path.name} in the sandbox"
        log.info(
            "%s: %s %s in the sandbox (bounds: %s)", self.field, mode, self.path.name, self.bounds.describe()
        )
        with tempfile.TemporaryDirectory(prefix="outside-archive-") as private:
            inputs = {name: Path(private) / name for name in (PROGRAM, *extra)}
            for name, data in {PROGRAM: self.data, **extra}.items():
                inputs[name].write_bytes(data)
            jailed = run_in_sandbox(["-m", CHILD, mode], inputs, self.bounds, what)
        try:
            files = child.read_frames(jailed.result, frozenset((*names, ERROR)))
        except child.FrameError as error:
            reason = failure(jailed, self.bounds) if jailed.returncode != 0 else error
            raise SandboxRunError(f"{what} failed: {reason}") from error
        if jailed.returncode == USER_ERROR and set(files) == {ERROR}:
            try:
                problem = str(json.loads(files[ERROR])["problem"])
            except (ValueError, KeyError, TypeError):
                problem = "it gave a reason that does not parse"
            raise SpecError(self.field, f"{_shown(problem)} (as found in the sandbox)")
        if jailed.returncode != 0:
            raise SandboxRunError(f"{what} failed: {failure(jailed, self.bounds)}")
        if set(files) != set(names):
            raise SandboxRunError(f"{what} failed: it sent {sorted(files)}, not {list(names)}")
        try:
            from_json(files[FOUND])
        except (ValueError, RecursionError) as error:
            raise SandboxRunError(
                f"{what}: it sent a signature that is not one ({_shown(str(error))})"
            ) from error
        return self._store(key, files)

    def _store(self, key: str, files: dict[str, bytes]) -> Path:
        """The files as cache folder ``key``, written whole under a temporary name and then renamed."""
        root = cache_root() / "outside-archives"
        root.mkdir(parents=True, exist_ok=True)
        staging, final = Path(tempfile.mkdtemp(prefix=f".{key[:12]}-", dir=root)), root / key
        try:
            for name, data in files.items():
                (staging / name).write_bytes(data)
            record = {name: file_sha256(staging / name) for name in files}
            (staging / RECORD).write_text(json.dumps(record))
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(final)  # a damaged entry (its files did not match the record)
            os.replace(staging, final)
        except OSError:
            concurrent = self._cached(key, tuple(files))  # another process stored the same conversion
            if concurrent is None:
                raise
            return concurrent
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # gone after the rename
        return final
