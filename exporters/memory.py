"""Memory per instance: what one onnxruntime session of a model holds once it has run its largest batch.

Measured, not estimated: activations at ``max_batch_size`` depend on how onnxruntime plans its buffers.
A fresh process (about a second) loads the inputs, runs the largest batch twice and reports the growth
of its peak resident set (``VmHWM`` over ``VmRSS`` before the session): weights, arena and buffers,
which the CPU arena keeps. Taken on demand (the planner, ``build --measure-memory``) and kept in
``memory.json`` beside ``export.json``, keyed by the model file's SHA-256, so each file is measured once.

Run as ``python -m exporters.memory MODEL.onnx INPUTS.npz``; prints JSON.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from exporters.artifacts.records import file_sha256, read_record, write_record
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


def measured_instance_memory(spec: ModelSpec, model: Path) -> int:
    """Bytes one session of ``spec``'s exported ``model`` holds after its ``max_batch_size``, from
    ``memory.json`` when that holds a figure for this very file, else measured now and recorded."""
    from exporters.sources.inputs import draw_inputs  # torch and the zoo, as the spec: not at module level

    record_path, sha256 = model.with_name(MEMORY_RECORD), file_sha256(model)
    key = f"cpu@{spec.max_batch_size}"
    record = read_record(record_path) or {}
    known = record.get("instance_bytes") if record.get("file_sha256") == sha256 else None
    known = known if isinstance(known, dict) else {}
    if isinstance(known.get(key), int):
        return known[key]
    arrays = draw_inputs(spec, spec.max_batch_size, seed=0)
    with tempfile.TemporaryDirectory() as folder:
        inputs = Path(folder) / "inputs.npz"
        np.savez(inputs, **{t.name: a for t, a in zip(spec.inputs, arrays, strict=True)})
        command = [sys.executable, "-m", "exporters.memory", str(model), str(inputs)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)
    if done.returncode != 0:
        raise ExporterError(f"measuring the memory of {model} failed: {done.stderr.strip()[-500:]}")
    measured = int(json.loads(done.stdout.strip().splitlines()[-1])["instance_bytes"])
    write_record(record_path, {"file_sha256": sha256, "instance_bytes": {**known, key: measured}})
    return measured


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m exporters.memory", description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("inputs", type=Path)
    args = parser.parse_args(argv)
    from python_backend.onnxruntime.ort_session import open_session

    feeds = dict(np.load(args.inputs))
    before = _status_kib("VmRSS") * 1024
    session = open_session(str(args.model), 1, 1, ["CPUExecutionProvider"])
    session.run(None, feeds)
    session.run(None, feeds)
    print(json.dumps({"instance_bytes": _status_kib("VmHWM") * 1024 - before}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
