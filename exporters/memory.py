"""Memory per instance: what one onnxruntime session of a model holds once it has run its largest batch.

Measured, not estimated, because activations at ``max_batch_size`` depend on the graph and on how
onnxruntime plans its buffers, and the planner puts instances on devices by this figure. A measurement
costs a fresh process (about a second), so it is taken on demand, never by every export: the planner
asks for it, and ``python -m exporters build --measure-memory`` records it for those who want it.
``measured_instance_memory`` keeps each figure in ``memory.json`` beside the model's ``export.json``,
keyed by the model file's SHA-256 (and the provider and batch), so each exported file is measured once.

* **CPU**: a fresh Python process loads the inputs, reads its resident set (``VmRSS``), creates a
  session and runs the largest batch twice, and reports the growth of its peak resident set
  (``VmHWM``). A fresh process holds nothing else, so the growth is the session's weights, its arena
  and the buffers of that batch. onnxruntime's CPU arena keeps what it allocated, so the peak is what
  the instance keeps holding while it serves.
* **GPU** (``--provider cuda``, on a GPU host with onnxruntime-gpu; the lent GPU machine has none and
  ``make gpu-check`` measures the torch path instead, docs/GPU.md): the same process on the CUDA provider;
  the figure is the memory the driver attributes to the process (``nvidia-smi
  --query-compute-apps``) after the batch, less what it held after creating its CUDA context (one
  tiny tensor on the device), so it counts the CUDA arena, weights and workspaces of the instance and
  not the context Triton pays once per process.

Run as ``python -m exporters.memory MODEL.onnx INPUTS.npz [--provider cpu|cuda]``; prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from exporters.artifacts.file_hash import file_sha256
from exporters.artifacts.records import read_record, write_record
from exporters.errors import ExporterError

if TYPE_CHECKING:  # the spec imports torch and the zoo: not for the measuring process
    from exporters.schema.models import ModelSpec

TIMEOUT_S = 300
MEMORY_RECORD = "memory.json"  # beside export.json: {file_sha256, instance_bytes: {"cpu@32": bytes}}


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise ExporterError(f"/proc/self/status has no {field}")


def _gpu_used_bytes(pid: int) -> int:
    listing = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    used = [int(row.split(",")[1]) for row in listing.splitlines() if row.split(",")[0].strip() == str(pid)]
    return sum(used) * 1024 * 1024


def _measure_here(model: Path, inputs: Path, provider: str) -> dict[str, int]:
    import onnxruntime as ort

    from python_backend.onnxruntime.ort_session import open_session

    feeds = dict(np.load(inputs))
    cuda = provider == "cuda"
    if cuda:
        ort.OrtValue.ortvalue_from_numpy(np.zeros(1, np.float32), "cuda", 0)  # the context alone
    before = _gpu_used_bytes(os.getpid()) if cuda else _status_kib("VmRSS") * 1024
    session = open_session(str(model), 1, 1, ["CUDAExecutionProvider" if cuda else "CPUExecutionProvider"])
    session.run(None, feeds)
    session.run(None, feeds)
    after = _gpu_used_bytes(os.getpid()) if cuda else _status_kib("VmHWM") * 1024
    return {"instance_bytes": after - before}


def instance_memory(model: Path, feeds: dict[str, np.ndarray], provider: str = "cpu") -> int:
    """Bytes one session of ``model`` holds after running ``feeds`` (its largest batch), measured in a
    fresh process (see the module docstring)."""
    with tempfile.TemporaryDirectory() as folder:
        inputs = Path(folder) / "inputs.npz"
        np.savez(inputs, **feeds)
        command = [sys.executable, "-m", "exporters.memory", str(model), str(inputs), "--provider", provider]
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)
    if done.returncode != 0:
        raise ExporterError(f"measuring the memory of {model} failed: {done.stderr.strip()[-500:]}")
    return int(json.loads(done.stdout.strip().splitlines()[-1])["instance_bytes"])


def measured_instance_memory(spec: ModelSpec, model: Path, provider: str = "cpu") -> int:
    """``instance_memory`` of ``spec``'s exported ``model`` at its ``max_batch_size``, from
    ``memory.json`` beside it when that holds a figure for this very file (its SHA-256), else measured
    now and recorded there."""
    from exporters.sources.inputs import draw_inputs  # torch and the zoo, as the spec: not at module level

    record_path, sha256 = model.with_name(MEMORY_RECORD), file_sha256(model)
    key = f"{provider}@{spec.max_batch_size}"
    record = read_record(record_path) or {}
    known = record.get("instance_bytes") if record.get("file_sha256") == sha256 else None
    known = known if isinstance(known, dict) else {}
    if isinstance(known.get(key), int):
        return known[key]
    arrays = draw_inputs(spec, spec.max_batch_size, seed=0)
    measured = instance_memory(model, {t.name: a for t, a in zip(spec.inputs, arrays, strict=True)}, provider)
    write_record(record_path, {"file_sha256": sha256, "instance_bytes": {**known, key: measured}})
    return measured


def weights_bytes(model: Path) -> int:
    """The bytes of the model's initializers (its weights), as stored."""
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    return sum(len(t.raw_data) or onnx.numpy_helper.to_array(t).nbytes for t in graph.initializer)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m exporters.memory", description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("inputs", type=Path)
    parser.add_argument("--provider", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args(argv)
    print(json.dumps(_measure_here(args.model, args.inputs, args.provider)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
