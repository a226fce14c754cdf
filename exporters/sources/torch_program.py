"""``source: {torch_export: program.pt2}``: a ``torch.export`` program from outside, served as ONNX.
The sandbox converts it and runs it on inputs drawn here; the converted file is then the model's source
as an ``onnx:`` file is, first held to the program's own outputs at the fp32 tolerance."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from exporters.artifacts.parity import compare_outputs, worst_of
from exporters.artifacts.torch_reference import widen
from exporters.errors import ExportCheckError, SpecError
from exporters.sandbox.child import ProgramTensor
from exporters.sandbox.outside_archive import CONVERTER_VERSION, OutsideArchive
from exporters.schema.models import ModelSpec, TorchExportSource
from exporters.schema.sections import VARIABLE, TensorSpec
from exporters.sources.inputs import draw_inputs
from exporters.sources.onnx_file import OnnxModelSource

EXAMPLE_BATCH = 2  # the dynamo exporter's example; the program's own dynamic axes decide the graph's
CHECK_BATCHES = (1, 3)  # as the exporter's parity check (3 exercises the batch axis beyond the example)


def _axis_fits(real: int, declared: int, declared_max: int, bound: int) -> bool:
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


def input_sets(spec: ModelSpec) -> list[list[np.ndarray]]:
    """The inputs the program runs on in the sandbox: the exporter's example, then the parity batches."""
    batches = [min(b, spec.max_batch_size) for b in (EXAMPLE_BATCH, *CHECK_BATCHES)]
    seeds = [0, *(100 + batch for batch in batches[1:])]
    return [[widen(a) for a in draw_inputs(spec, b, seed)] for b, seed in zip(batches, seeds, strict=True)]


class TorchProgramSource(OnnxModelSource):
    """The ONNX file converted from the program in the sandbox; the archive's hash is its identity."""

    def __init__(self, spec: ModelSpec) -> None:
        assert isinstance(spec.source, TorchExportSource)
        field = f"{spec.name}.source.torch_export"
        archive = OutsideArchive(Path(spec.source.torch_export), field)
        found_inputs, found_outputs = archive.describe()
        _check_against(spec, "inputs", spec.inputs, found_inputs)
        _check_against(spec, "outputs", spec.outputs, found_outputs)
        self.archive_sha256 = archive.sha256
        sets = input_sets(spec)
        onnx_file, outputs = archive.convert(
            [t.name for t in spec.inputs], [t.name for t in spec.outputs], sets
        )
        super().__init__(spec, onnx_file, field)
        self._hold_to_program(sets, outputs)

    def _hold_to_program(self, sets: list[list[np.ndarray]], expected: list[list[np.ndarray]]) -> None:
        names = [t.name for t in self.spec.outputs]
        tolerances = [t.tolerance for t in self.spec.outputs]
        reports = []
        for arrays, outputs in zip(sets, expected, strict=True):
            what = f"{self.spec.name} (ONNX converted in the sandbox vs the program, batch {len(arrays[0])})"
            try:
                reports.append(
                    compare_outputs(self.reference(arrays), outputs, "fp32", what, names, tolerances)
                )
            except ExportCheckError:
                raise
            except Exception as error:  # onnxruntime refusing the converted file, or outputs of other shapes
                raise ExportCheckError(f"{what}: {type(error).__name__}: {error}") from error
        worst = worst_of(reports)
        self.conversion = {
            "check": "the ONNX converted in the sandbox vs the program's own outputs there (fp32)",
            "max_abs_error": worst.max_abs_error, "max_rel_error": worst.max_rel_error,
            "tolerance": worst.tolerance, "outputs": [c.record() for c in worst.checks],
        }  # fmt: skip

    def fold_identity(self, digest: Any) -> None:
        digest.update(f"torch_export {CONVERTER_VERSION} {self.archive_sha256}".encode())
