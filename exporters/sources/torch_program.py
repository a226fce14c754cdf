"""``source: {torch_export: program.pt2}``: a ``torch.export`` program, loaded without unpickling.

The archive goes through the project's safe loader (``python_backend.torch_stage.safe_program``: refused
if loading would unpickle anything) and is exported to ONNX from the program itself with the
dynamo-based exporter (the only one that takes an ``ExportedProgram``), opset 18, as one file. The
program must have been exported with a dynamic batch axis that admits 1 (``Dim("batch", min=1)``);
its other dynamic axes become the spec's variable axes, bounded by the program's own range constraints.
The reference is the program itself (``ExportedProgram.module()``).
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from exporters.errors import SpecError
from exporters.file_hash import hash_files
from exporters.fp16 import to_fp16
from exporters.sources.base import TorchModuleSource
from exporters.spec import ModelSpec, TorchExportSource
from exporters.spec_sections import MODEL_DTYPES, VARIABLE, TensorSpec
from exporters.torch_reference import widen
from python_backend.dtypes import DTYPES
from python_backend.torch_stage.safe_program import UnsafeArtifactError, load_exported_program

DYNAMO_OPSET = 18
# torch dtype -> spec name, from the one dtype table (bf16 only between pipeline stages: not a model's)
TORCH_TO_SPEC = {d.torch_dtype(): key for key, d in DTYPES.items() if key in MODEL_DTYPES}


@dataclass(frozen=True)
class ProgramTensor:
    """A user input or output of the program: dims without the batch axis (-1 where dynamic, with its
    upper bound in ``bounds``), and the batch axis' range; ``range`` for ids feeding an embedding."""

    name: str
    dtype: str
    dims: tuple[int, ...]
    bounds: tuple[int, ...]
    batch_range: tuple[int, float] | None  # None: the batch axis is static
    range: tuple[int, int] | None = None


def load_program(path: Path, field: str) -> torch.export.ExportedProgram:
    if not path.is_file():
        raise SpecError(field, f"no such file: {path}")
    try:
        return load_exported_program(path)
    except UnsafeArtifactError as error:
        raise SpecError(field, f"refused: {error}") from error
    except Exception as error:  # torch.export.load raises many kinds on a foreign archive
        raise SpecError(field, f"cannot load {path}: {type(error).__name__}: {error}") from error


def _axis(size: Any, program: torch.export.ExportedProgram) -> tuple[int, float, float]:
    """(value or -1, lower, upper) of one axis: symbolic sizes read their range constraint."""
    if isinstance(size, int):
        return size, size, size
    bounds = program.range_constraints.get(size.node.expr)
    lower = int(bounds.lower) if bounds is not None else 0
    upper = float(bounds.upper) if bounds is not None and bounds.upper.is_finite else math.inf
    return VARIABLE, lower, upper


def _tensor(name: str, value: Any, program: torch.export.ExportedProgram, where: str) -> ProgramTensor:
    if value.dtype not in TORCH_TO_SPEC:
        raise SpecError(
            where, f"program tensor {name!r} is {value.dtype}; served types: fp32, fp16, int64, int32"
        )
    axes = [_axis(size, program) for size in value.shape]
    if not axes:
        raise SpecError(where, f"program tensor {name!r} is a scalar; served tensors have a batch axis")
    batch, rest = axes[0], axes[1:]
    return ProgramTensor(
        name,
        TORCH_TO_SPEC[value.dtype],
        tuple(a[0] for a in rest),
        tuple(int(a[2]) if a[0] == VARIABLE and math.isfinite(a[2]) else a[0] for a in rest),
        None if batch[0] != VARIABLE else (batch[1], batch[2]),
    )


def program_tensors(
    program: torch.export.ExportedProgram, where: str
) -> tuple[list[ProgramTensor], list[ProgramTensor]]:
    """The program's user inputs and outputs; outputs are called ``output`` (``output<k>`` for several)."""
    signature = program.graph_signature
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    tables = {}
    for node in program.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.embedding.default:
            weight, ids = node.args[0], node.args[1]
            tables[ids.name] = (0, int(weight.meta["val"].shape[0]))
    inputs = []
    for name in signature.user_inputs:
        tensor = _tensor(name, placeholders[name].meta["val"], program, where)
        inputs.append(replace(tensor, range=tables.get(name)))
    output_node = next(n for n in program.graph.nodes if n.op == "output")
    values = [arg.meta["val"] for arg in output_node.args[0][: len(signature.user_outputs)]]
    names = ["output"] if len(values) == 1 else [f"output{k}" for k in range(len(values))]
    outputs = [_tensor(n, v, program, where) for n, v in zip(names, values, strict=True)]
    return inputs, outputs


def _axis_fits(real: int, declared: int, declared_max: int, bound: int) -> bool:
    """A fixed program axis needs the same size; a dynamic one takes any size or a -1 within its bound."""
    if real != VARIABLE:
        return declared == real
    return declared != VARIABLE or declared_max <= bound


def _check_against(
    spec: ModelSpec, kind: str, declared: tuple[TensorSpec, ...], found: list[ProgramTensor]
) -> None:
    if len(declared) != len(found):
        raise SpecError(f"{spec.name}.{kind}", f"lists {len(declared)} {kind}, the program has {len(found)}")
    for index, (tensor, real) in enumerate(zip(declared, found, strict=True)):
        path = f"{spec.name}.{kind}[{index}]"
        if not (real.dtype == tensor.dtype or (real.dtype == "fp32" and tensor.dtype == "fp16")):
            raise SpecError(f"{path}.dtype", f"is {tensor.dtype}, the program's {real.name} is {real.dtype}")
        if real.batch_range is None or real.batch_range[0] > 1 or real.batch_range[1] < spec.max_batch_size:
            got = "static" if real.batch_range is None else f"{real.batch_range[0]}..{real.batch_range[1]}"
            raise SpecError(
                f"{spec.name}.source.torch_export",
                f"{real.name}'s batch axis is {got}; export with a dynamic batch "
                f"Dim('batch', min=1, max>={spec.max_batch_size})",
            )
        agrees = len(real.dims) == len(tensor.shape) and all(
            _axis_fits(*axis)
            for axis in zip(real.dims, tensor.shape, tensor.largest, real.bounds, strict=True)
        )
        if not agrees:
            raise SpecError(
                f"{path}.shape",
                f"is {list(tensor.shape)} (max {list(tensor.largest)}), the program's {real.name} is "
                f"{list(real.dims)} (max {list(real.bounds)})",
            )


class TorchProgramSource(TorchModuleSource):
    """The program's own module is the reference; the program file is its identity."""

    def __init__(self, spec: ModelSpec) -> None:
        assert isinstance(spec.source, TorchExportSource)
        self.field = f"{spec.name}.source.torch_export"
        self.path = Path(spec.source.torch_export)
        self.program = load_program(self.path, self.field)
        super().__init__(spec, self.program.module(), [self.path])

    def check_signature(self) -> None:
        inputs, outputs = program_tensors(self.program, self.field)
        _check_against(self.spec, "inputs", self.spec.inputs, inputs)
        _check_against(self.spec, "outputs", self.spec.outputs, outputs)
        super().check_signature()

    def fold_identity(self, digest: Any) -> None:
        hash_files(self.files, digest)

    def onnx_bytes(self) -> bytes:
        example = tuple(torch.from_numpy(widen(a)) for a in self.inputs(2, seed=0))
        # The dynamo exporter prints progress and warns about torchvision ops it will not need.
        registration = logging.getLogger("torch.onnx._internal.exporter._registration")
        level = registration.level
        registration.setLevel(logging.ERROR)
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                warnings.simplefilter("ignore")
                exported = torch.onnx.export(
                    self.program, example, input_names=[t.name for t in self.spec.inputs],
                    output_names=[t.name for t in self.spec.outputs], dynamo=True, external_data=False,
                    opset_version=DYNAMO_OPSET,
                )  # fmt: skip
        finally:
            registration.setLevel(level)
        model = exported.model_proto
        return (to_fp16(model) if self.spec.precision == "fp16" else model).SerializeToString()
