"""Read a model's signature from its artifact (an ONNX graph, a ``torch.export`` program), so the spec
may leave ``inputs``/``outputs`` out and ``exporters init`` can print them; what the artifact does not
state (a variable axis' bound, an integer input's valid ids) the user gives."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from exporters.errors import SpecError
from exporters.schema.models import ModelSpec
from exporters.schema.sections import INTEGER_DTYPES, VARIABLE, TensorSpec, served_float


def to_tensor_specs(
    found: list[Any], kind: str, precision: str, where: str, max_length: int | None = None,
    ranges: Mapping[str, tuple[int, int]] | None = None,
) -> tuple[TensorSpec, ...]:  # fmt: skip
    """``GraphTensor``/``ProgramTensor``s as spec tensors; ``ranges``: ``init --range`` by input name."""
    ranges = ranges or {}
    if kind == "inputs":
        integers = [item.name for item in found if item.dtype in INTEGER_DTYPES]
        unknown = sorted(set(ranges) - set(integers))
        if unknown:
            raise SpecError(
                "--range", f"{unknown[0]!r} is not an integer input of {where} (integer inputs: {integers})"
            )
    tensors = []
    for item in found:
        bounds = tuple(getattr(item, "bounds", item.dims))
        max_shape = None
        if VARIABLE in item.dims:
            known = [b for d, b in zip(item.dims, bounds, strict=True) if d == VARIABLE and b != VARIABLE]
            if len(known) < item.dims.count(VARIABLE) and max_length is None:
                raise SpecError(
                    where,
                    f"{kind[:-1]} {item.name!r} has a variable axis {list(item.dims)} with no bound in the "
                    "artifact; list the tensors in the spec with max_shape (or pass --max-length to init)",
                )
            max_shape = tuple(
                (b if b != VARIABLE and math.isfinite(b) else max_length) if d == VARIABLE else d
                for d, b in zip(item.dims, bounds, strict=True)
            )
        id_range = (ranges.get(item.name) or item.range) if kind == "inputs" else None
        if kind == "inputs" and item.dtype in INTEGER_DTYPES and id_range is None:
            raise SpecError(
                where,
                f"integer input {item.name!r} does not index an embedding table, so its valid ids are "
                f"unknown; give them: exporters init --range {item.name}=LO:HI (ids LO to HI-1), or list "
                "the inputs in the spec with range: [lo, hi)",
            )
        dtype = served_float(precision) if item.dtype in ("fp32", "fp16") else item.dtype
        try:
            tensors.append(TensorSpec(item.name, dtype, tuple(item.dims), max_shape, id_range))
        except SpecError as error:  # named by the artifact's tensor, and the field that holds it
            raise SpecError(f"{where}: {kind}[{len(tensors)}].{error.path}", error.problem) from error
    return tuple(tensors)


def artifact_tensors(kind: str, location: str, where: str) -> tuple[list[Any], list[Any]]:
    if kind == "onnx":
        from exporters.sources.onnx_file import graph_tensors, read_model

        return graph_tensors(read_model(Path(location), where, load_external_data=False), where)
    from exporters.sandbox.outside_archive import OutsideArchive

    return OutsideArchive(Path(location), where).describe()  # read in the sandbox


def read_signature(spec: ModelSpec) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """``spec``'s inputs and outputs, those it left out read from its artifact."""
    kind = spec.source_kind
    where = f"{spec.name}.source.{kind}"
    inputs, outputs = artifact_tensors(kind, getattr(spec.source, kind), where)
    return (
        spec.inputs or to_tensor_specs(inputs, "inputs", spec.precision, where),
        spec.outputs or to_tensor_specs(outputs, "outputs", spec.precision, where),
    )
