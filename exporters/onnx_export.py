"""A model of the spec → ONNX, checked against its source before it enters the repository: whatever the
source, its signature is checked, the file written under a temporary name, checked (``onnx.checker``,
external data, parity with the fp32 reference) and only then named ``model.onnx``; a content hash of
the spec and the source lets a rebuild skip work already done."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from torch import nn

from exporters.artifacts.onnx_files import OPSET, check_external_data, run_or_explain
from exporters.artifacts.parity import compare_outputs, worst_of
from exporters.artifacts.records import current_record, file_sha256, write_record
from exporters.errors import ExportCheckError
from exporters.precision.int8 import to_int8
from exporters.schema.models import ModelSpec
from exporters.sources.base import TorchModuleSource
from exporters.sources.inputs import calibration_inputs
from exporters.sources.load import load_source
from python_backend.atomic_files import staged
from python_backend.batching import InvalidInputError, check_shared_axes, shared_axes
from python_backend.dtypes import DTYPES
from python_backend.onnxruntime.ort_session import open_session

log = logging.getLogger(__name__)

EXPORTER_VERSION = "5"  # bump when the export procedure changes, to invalidate cached artifacts
# Batch sizes the parity check runs (3 exercises the dynamic batch axis: the export's example has 2).
# int8 is judged on agreement over many rows (top-1 share, worst cosine): one batch of 64.
CHECK_BATCHES = {"fp32": (1, 3), "fp16": (1, 3), "int8": (64,)}


@dataclass(frozen=True)
class Artifact:
    path: Path
    content_hash: str
    precision: str
    max_abs_error: float
    max_rel_error: float
    tolerance: float
    cached: bool = False
    file_sha256: str = ""  # of model.onnx as written; a cache hit requires the file to still match
    outputs: list[dict[str, Any]] = field(default_factory=list)  # per output: figures and limits (parity)
    # How a source converted before it is served (torch_export, in the sandbox) matched its original.
    conversion: dict[str, Any] = field(default_factory=dict)


# The spec's fields the exported file depends on: equal in these, two models export the same file.
HASHED_FIELDS = ("source", "options", "seed", "precision", "calibration", "inputs", "outputs")
EXPORT_RECORD = "export.json"  # written beside model.onnx


def content_hash(spec: ModelSpec, identity: Any) -> str:
    """Hash of the spec's ``HASHED_FIELDS`` and what ``identity`` (a source, a module's weights) folds in."""
    digest = hashlib.sha256()
    fields = {name: getattr(spec, name) for name in HASHED_FIELDS}
    fields |= {"opset": OPSET, "exporter": EXPORTER_VERSION, "torch": torch.__version__}
    plain = json.dumps(fields, sort_keys=True, default=lambda v: asdict(v) if is_dataclass(v) else list(v))
    digest.update(plain.encode())
    source = TorchModuleSource(spec, identity) if isinstance(identity, nn.Module) else identity
    source.fold_identity(digest)  # a module's weights, as its source folds them
    return digest.hexdigest()


def run_onnx(path: Path, spec: ModelSpec, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """``inputs`` through the file as our onnxruntime backend runs it (its session options, named axes
    and warm-up request), so a file the backend would refuse fails the build, not the server's load."""
    session = open_session(str(path), spec.threads.intra_op, spec.threads.inter_op, ["CPUExecutionProvider"])
    axes = shared_axes(session.get_inputs())
    names = [t.name for t in spec.outputs]
    zeros = {t.name: np.zeros((1, *t.largest), DTYPES[t.dtype].numpy_dtype()) for t in spec.inputs}
    feeds = [zeros] * spec.warmup + [{t.name: a for t, a in zip(spec.inputs, inputs, strict=True)}]
    for feed in feeds:
        try:
            check_shared_axes(feed, axes)
        except InvalidInputError as error:
            raise ExportCheckError(
                f"{spec.name}: the backend would refuse these inputs ({error}): the ONNX file gives these "
                "axes one name, so they must be equal; make max_shape and lengths agree, or rename the axes"
            ) from error
        what = "the warm-up, at max_shape" if feed is not feeds[-1] else "inputs drawn as the spec says"
        outputs = run_or_explain(session, names, feed, spec.name, what)
    return outputs


def export_onnx(spec: ModelSpec, out_dir: Path) -> Artifact:
    """Export ``spec``'s model to ``out_dir/model.onnx`` unless an identical export is already there."""
    source = load_source(spec)
    source.check_signature()
    digest = content_hash(spec, source)
    path, record_path = out_dir / "model.onnx", out_dir / EXPORT_RECORD
    record = current_record(record_path, path, digest)  # an identical export whose file is still there
    with contextlib.suppress(TypeError):  # a record of another shape: rebuild
        if record is not None:
            return Artifact(path=path, cached=True, **{k: v for k, v in record.items() if k != "path"})
    names, tolerances = [t.name for t in spec.outputs], [t.tolerance for t in spec.outputs]
    data = source.onnx_bytes()
    if spec.precision == "int8":  # quantized from the fp32 export, calibrated on the spec's batches
        batches = calibration_inputs(spec, source.zoo_model)
        data = to_int8(data, [{t.name: a for t, a in zip(spec.inputs, b, strict=True)} for b in batches])
    with staged(path, len(data)) as staging:
        staging.write_bytes(data)
        onnx.checker.check_model(str(staging), full_check=True)
        check_external_data(staging)
        reports = []
        for batch in CHECK_BATCHES[spec.precision]:
            inputs = source.inputs(batch, seed=100 + batch)
            reports.append(compare_outputs(
                run_onnx(staging, spec, inputs), source.reference(inputs), spec.precision,
                f"{spec.name} ({spec.precision} ONNX, batch {batch})", names, tolerances,
            ))  # fmt: skip
        worst = worst_of(reports)
        sha256 = file_sha256(staging)
    artifact = Artifact(
        path, digest, spec.precision, worst.max_abs_error, worst.max_rel_error, worst.tolerance,
        file_sha256=sha256, outputs=[c.record() for c in worst.checks], conversion=source.conversion,
    )  # fmt: skip
    write_record(record_path, {k: v for k, v in asdict(artifact).items() if k not in ("path", "cached")})
    log.info("%s: exported %s, max rel error %.2e", spec.name, spec.precision, artifact.max_rel_error)
    return artifact
