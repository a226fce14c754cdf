"""``source: {onnx: file}``: a user's ONNX file, checked (external data confined to its folder,
``onnx.checker``, a dynamic batch axis, the spec's signature) and copied in as one self-contained file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError

from exporters.artifacts.onnx_files import check_external_data, run_or_explain
from exporters.artifacts.torch_reference import widen
from exporters.errors import ExportCheckError, SpecError
from exporters.precision.fp16 import to_fp16
from exporters.schema.models import ModelSpec
from exporters.schema.sections import VARIABLE, TensorSpec
from exporters.sources.base import LoadedSource
from python_backend.dtypes import DTYPES
from python_backend.onnxruntime.ort_session import open_session

# ONNX element type -> spec name, from the one dtype table (types numpy, hence a model, can carry)
ONNX_DTYPES = {
    onnx.helper.np_dtype_to_tensor_dtype(d.numpy_dtype()): key
    for key, d in DTYPES.items()
    if d.numpy is not None
}


@dataclass(frozen=True)
class GraphTensor:
    """A graph input or output: ``dims`` without the batch axis (-1: symbolic), ``batch_fixed`` when the
    first axis is fixed, ``range`` for ids that ``Gather`` from an initializer (``[0, rows)``)."""

    name: str
    dtype: str
    dims: tuple[int, ...]
    batch_fixed: int | None
    range: tuple[int, int] | None = None
    rank: int | None = None  # None: the file states no shape


def _id_ranges(graph: onnx.GraphProto) -> dict[str, tuple[int, int]]:
    tables = {t.name: t.dims[0] for t in graph.initializer if t.dims}
    return {
        node.input[1]: (0, int(tables[node.input[0]]))
        for node in graph.node
        if node.op_type == "Gather" and len(node.input) == 2 and node.input[0] in tables
    }


def graph_tensors(model: onnx.ModelProto, where: str) -> tuple[list[GraphTensor], list[GraphTensor]]:
    """The graph's real inputs (initializers excluded) and outputs."""
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    ranges = _id_ranges(graph)

    def read(value: onnx.ValueInfoProto) -> GraphTensor:
        tensor_type = value.type.tensor_type
        if tensor_type.elem_type not in ONNX_DTYPES:
            name = onnx.TensorProto.DataType.Name(tensor_type.elem_type)
            raise SpecError(
                where, f"tensor {value.name!r} has type {name}; served types: fp32, fp16, int64, int32"
            )
        dims = [d.dim_value if d.HasField("dim_value") else VARIABLE for d in tensor_type.shape.dim]
        batch = dims[0] if dims and dims[0] != VARIABLE else None
        rank = len(dims) if tensor_type.HasField("shape") else None
        dtype = ONNX_DTYPES[tensor_type.elem_type]
        return GraphTensor(value.name, dtype, tuple(dims[1:]), batch, ranges.get(value.name), rank)

    inputs = [read(value) for value in graph.input if value.name not in initializers]
    outputs = [read(value) for value in graph.output]
    check_batch_axis(inputs, outputs, where)
    return inputs, outputs


def check_batch_axis(inputs: list[GraphTensor], outputs: list[GraphTensor], where: str) -> None:
    """``SpecError`` in plain words when a tensor has no batch axis (no axis, or a fixed first one), or
    none beyond it: the spec's shapes would be read one axis off."""
    named = [(kind, t) for kind, tensors in (("input", inputs), ("output", outputs)) for t in tensors]
    for kind, tensor in named:
        if tensor.rank == 0 or tensor.batch_fixed is not None:
            shape = "[] (a scalar)" if tensor.rank == 0 else str([tensor.batch_fixed, *tensor.dims])
            raise SpecError(
                where,
                f"the model has no batch axis: {kind} {tensor.name!r} is {shape}, where a batching model's "
                "tensors start with an axis of any size; re-export it with a dynamic first axis (torch: "
                f"dynamic_axes={{{tensor.name!r}: {{0: 'batch'}}}}, outputs too). Models without one "
                "(Triton's max_batch_size: 0) are not served here",
            )
    for kind, tensor in named:
        if tensor.rank == 1:
            raise SpecError(
                where,
                f"{kind} {tensor.name!r} has only the batch axis ([?]); Triton's batching models need an "
                "axis beyond it: re-export it as [batch, 1]",
            )


def _check_against(
    spec: ModelSpec, kind: str, declared: tuple[TensorSpec, ...], graph: list[GraphTensor]
) -> None:
    by_name = {t.name: t for t in graph}
    missing = sorted(set(by_name) - {t.name for t in declared})
    if kind == "inputs" and missing:
        raise SpecError(f"{spec.name}.inputs", f"the ONNX file also takes {missing[0]!r}; list every input")
    for index, tensor in enumerate(declared):
        path = f"{spec.name}.{kind}[{index}]"
        found = by_name.get(tensor.name)
        if found is None:
            raise SpecError(
                f"{path}.name", f"the ONNX file has no {kind[:-1]} {tensor.name!r} (it has {sorted(by_name)})"
            )
        floats = {"fp32", "fp16"}
        same_kind = found.dtype == tensor.dtype or (found.dtype == "fp32" and tensor.dtype in floats)
        if not same_kind:
            raise SpecError(f"{path}.dtype", f"is {tensor.dtype}, the ONNX file says {found.dtype}")
        agrees = len(found.dims) == len(tensor.shape) and all(
            f in (VARIABLE, d) for f, d in zip(found.dims, tensor.shape, strict=True)
        )
        if not agrees:
            raise SpecError(
                f"{path}.shape", f"is {list(tensor.shape)}, the ONNX file says {list(found.dims)} (-1: any)"
            )


class OnnxModelSource(LoadedSource):
    """An ONNX file (the user's, or one converted in the sandbox); the reference is the file itself."""

    def __init__(self, spec: ModelSpec, path: Path, field: str) -> None:
        super().__init__(spec)
        self.field, self.path = field, path
        self.model = load_checked(self.path, self.field)
        self.graph = graph_tensors(self.model, self.field)  # an unserved type or batch axis: refused here
        # A shape it refuses is explained by run_or_explain.
        self.session = open_session(
            self.model.SerializeToString(), 0, 0, ["CPUExecutionProvider"], quiet=True
        )

    def check_signature(self) -> None:
        _check_against(self.spec, "inputs", self.spec.inputs, self.graph[0])
        _check_against(self.spec, "outputs", self.spec.outputs, self.graph[1])
        super().check_signature()

    def reference(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        feeds = {t.name: widen(a) for t, a in zip(self.spec.inputs, inputs, strict=True)}
        names = [t.name for t in self.spec.outputs]
        outputs = run_or_explain(self.session, names, feeds, self.spec.name, "your ONNX file")
        return [widen(o) for o in outputs]

    def fold_identity(self, digest: Any) -> None:
        digest.update(self.model.SerializeToString())

    def onnx_bytes(self) -> bytes:
        needs_half = self.spec.precision == "fp16" and any(t.dtype == "fp32" for t in self.graph[0])
        return (to_fp16(self.model) if needs_half else self.model).SerializeToString()


def read_model(path: Path, field: str, load_external_data: bool = True) -> onnx.ModelProto:
    """The ONNX file at ``path``; a ``SpecError`` naming ``field`` when it is not an ONNX model."""
    if not path.is_file():
        raise SpecError(field, f"no such file: {path}")
    try:
        model = onnx.load(str(path), load_external_data=load_external_data)
    except (DecodeError, OSError, ValueError) as error:
        raise SpecError(field, f"{path} is not an ONNX model ({type(error).__name__}: {error})") from error
    if not model.HasField("graph") or model.ir_version < 1:
        raise SpecError(field, f"{path} is not an ONNX model (no graph or IR version in it)")
    return model


def load_checked(path: Path, field: str) -> onnx.ModelProto:
    """The user's ONNX file with its external data, after the confinement and checker checks."""
    try:
        check_external_data(path, read_model(path, field, load_external_data=False))
    except ExportCheckError as error:
        raise SpecError(field, str(error)) from error
    model = read_model(path, field)  # its external data, now known to lie inside its folder
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError, OSError, ValueError) as error:
        raise SpecError(field, f"{path} is not a valid ONNX model: {error}") from error
    return model
