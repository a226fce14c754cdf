"""torch → ONNX for one model of the spec, checked against torch before it enters the repository.

``export_onnx`` is a pure function of (spec, out_dir): the same spec and weights give the same file,
and a content hash of both lets a rebuild skip work already done. Uses the TorchScript-based exporter
(``dynamo=False``), which gives the spec's tensor names exactly and takes a fraction of a second per
model; the graph is checked with ``onnx.checker`` and numerically with onnxruntime on the CPU.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

from exporters.errors import ExportCheckError, SpecError
from exporters.file_hash import file_matches, file_sha256
from exporters.parity import compare_outputs
from exporters.spec import ModelSpec
from exporters.zoo.reference import build_torch_model, sample_inputs, torch_reference

log = logging.getLogger(__name__)

OPSET = 17
EXPORTER_VERSION = "1"  # bump when the export procedure changes, to invalidate cached artifacts


@dataclass(frozen=True)
class Artifact:
    """What an export produced and how well it matched torch."""

    path: Path
    content_hash: str
    precision: str
    max_abs_error: float
    max_rel_error: float
    tolerance: float
    cached: bool = False
    file_sha256: str = ""  # of model.onnx as written; a cache hit requires the file to still match


def content_hash(spec: ModelSpec, model: nn.Module) -> str:
    """Hash of everything that determines the exported file: the spec's model fields and the weights."""
    digest = hashlib.sha256()
    identity = {
        "source": spec.source,
        "options": spec.options,
        "seed": spec.seed,
        "precision": spec.precision,
        "inputs": [asdict(t) for t in spec.inputs],
        "outputs": [asdict(t) for t in spec.outputs],
        "opset": OPSET,
        "exporter": EXPORTER_VERSION,
        "torch": torch.__version__,
    }
    digest.update(json.dumps(identity, sort_keys=True, default=list).encode())
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def check_signature(spec: ModelSpec, model: nn.Module) -> None:
    """The spec's declared inputs and outputs must match what the model really takes and gives."""
    inputs = sample_inputs(spec, model, 2, seed=0)
    for index, (array, tensor) in enumerate(zip(inputs, spec.inputs, strict=True)):
        if array.shape[1:] != tensor.shape:
            raise SpecError(
                f"{spec.name}.inputs[{index}].shape",
                f"is {list(tensor.shape)}, the model takes {list(array.shape[1:])}",
            )
    outputs = torch_reference(model, inputs)
    if len(outputs) != len(spec.outputs):
        raise SpecError(
            f"{spec.name}.outputs", f"lists {len(spec.outputs)} outputs, the model gives {len(outputs)}"
        )
    for index, (array, tensor) in enumerate(zip(outputs, spec.outputs, strict=True)):
        if array.shape[1:] != tensor.shape:
            raise SpecError(
                f"{spec.name}.outputs[{index}].shape",
                f"is {list(tensor.shape)}, the model gives {list(array.shape[1:])}",
            )


def check_external_data(model_path: Path) -> None:
    """Reject ONNX initializers stored outside the model's own folder (path traversal on load)."""
    model = onnx.load(str(model_path), load_external_data=False)
    root = model_path.parent.resolve()
    for tensor in model.graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        target = (root / location).resolve()
        if Path(location).is_absolute() or not target.is_relative_to(root):
            raise ExportCheckError(
                f"{model_path}: initializer {tensor.name!r} points outside the model folder: {location!r}"
            )


def run_onnx(path: Path, spec: ModelSpec, inputs: list[np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(
        [t.name for t in spec.outputs], {t.name: a for t, a in zip(spec.inputs, inputs, strict=True)}
    )


def export_module_onnx(
    module: nn.Module,
    example: tuple[torch.Tensor, ...],
    input_names: list[str],
    output_names: list[str],
    path: Path,
) -> None:
    """``torch.onnx.export`` with this project's conventions: the given tensor names, a dynamic batch
    axis on every tensor, ``OPSET``, the TorchScript-based exporter. Used for models and pipeline stages."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            example,
            str(path),
            input_names=input_names,
            output_names=output_names,
            dynamic_axes={name: {0: "batch"} for name in [*input_names, *output_names]},
            opset_version=OPSET,
            dynamo=False,
        )


def _export_file(spec: ModelSpec, model: nn.Module, path: Path) -> None:
    # A copy: halving in place would round the reference model's weights too.
    export_model = copy.deepcopy(model).half() if spec.precision == "fp16" else model
    example = tuple(torch.from_numpy(a) for a in sample_inputs(spec, model, 2, seed=0))
    export_module_onnx(
        export_model, example, [t.name for t in spec.inputs], [t.name for t in spec.outputs], path
    )


def export_onnx(spec: ModelSpec, out_dir: Path) -> Artifact:
    """Export ``spec``'s model to ``out_dir/model.onnx`` unless an identical export is already there.

    The file only takes its final name after ``onnx.checker`` and the parity check against torch
    (batch sizes 1 and 3, so the dynamic batch axis is exercised) have passed.
    """
    model = build_torch_model(spec)
    check_signature(spec, model)
    digest = content_hash(spec, model)
    path, record_path = out_dir / "model.onnx", out_dir / "export.json"
    if path.exists() and record_path.exists():
        record = json.loads(record_path.read_text())
        if record.get("content_hash") == digest and file_matches(path, record.get("file_sha256")):
            log.info("%s: export up to date (%s)", spec.name, digest[:12])
            return Artifact(path=path, cached=True, **{k: v for k, v in record.items() if k != "path"})
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = out_dir / "model.onnx.partial"
    _export_file(spec, model, staging)
    onnx.checker.check_model(str(staging), full_check=True)
    check_external_data(staging)
    worst = None
    for batch in (1, 3):
        inputs = sample_inputs(spec, model, batch, seed=100 + batch)
        report = compare_outputs(
            run_onnx(staging, spec, inputs),
            torch_reference(model, inputs),
            spec.precision,
            f"{spec.name} ({spec.precision} ONNX, batch {batch})",
        )
        worst = report if worst is None or report.max_rel_error > worst.max_rel_error else worst
    staging.replace(path)
    artifact = Artifact(
        path,
        digest,
        spec.precision,
        worst.max_abs_error,
        worst.max_rel_error,
        worst.tolerance,
        file_sha256=file_sha256(path),
    )
    record_path.write_text(
        json.dumps({k: v for k, v in asdict(artifact).items() if k not in ("path", "cached")}, indent=2)
    )
    log.info("%s: exported %s, max rel error %.2e", spec.name, spec.precision, artifact.max_rel_error)
    return artifact
