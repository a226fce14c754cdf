"""A ``torch.export`` program's user inputs and outputs, read inside the sandbox and sent out as JSON;
``from_json`` takes back only the exact shape of a ``ProgramTensor`` (the dataclass is its schema)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Any

from exporters.errors import SpecError
from exporters.schema.sections import MODEL_DTYPES, VARIABLE
from exporters.schema.typed import check_fields, parse

MAX_TENSORS = 1024


class SignatureError(ValueError):
    """The program has a tensor that cannot be served (a dtype, or no batch axis)."""


@dataclass(frozen=True)
class ProgramTensor:
    """A user input or output: dims without the batch axis (-1 where dynamic, bounded by ``bounds``),
    the batch axis' range, and ``range`` for ids feeding an embedding."""

    name: str
    dtype: str
    dims: tuple[int, ...]
    bounds: tuple[int, ...]
    batch_range: tuple[int, float] | None  # None: the batch axis is static
    range: tuple[int, int] | None

    def __post_init__(self) -> None:
        check_fields(self)
        if self.dtype not in MODEL_DTYPES:
            raise SpecError("dtype", f"{self.dtype[:80]!r} is not a dtype the spec knows")
        if len(self.bounds) != len(self.dims):
            raise SpecError("bounds", f"{len(self.bounds)} bounds for {len(self.dims)} dims")


def _axis(size: Any, program: Any) -> tuple[int, float, float]:
    """(value or -1, lower, upper) of one axis: symbolic sizes read their range constraint."""
    if isinstance(size, int):
        return size, size, size
    bounds = program.range_constraints.get(size.node.expr)
    lower = int(bounds.lower) if bounds is not None else 0
    upper = float(bounds.upper) if bounds is not None and bounds.upper.is_finite else math.inf
    return VARIABLE, lower, upper


def _tensor(name: str, value: Any, program: Any, table_rows: int | None) -> ProgramTensor:
    from python_backend.dtypes import DTYPES

    by_torch = {d.torch_dtype(): key for key, d in DTYPES.items() if key in MODEL_DTYPES}
    if value.dtype not in by_torch:
        raise SignatureError(
            f"program tensor {name!r} is {value.dtype}; served types: fp32, fp16, int64, int32"
        )
    axes = [_axis(size, program) for size in value.shape]
    if not axes:
        raise SignatureError(f"program tensor {name!r} is a scalar; served tensors have a batch axis")
    batch, rest = axes[0], axes[1:]
    return ProgramTensor(
        name,
        by_torch[value.dtype],
        tuple(a[0] for a in rest),
        tuple(int(a[2]) if a[0] == VARIABLE and math.isfinite(a[2]) else a[0] for a in rest),
        None if batch[0] != VARIABLE else (batch[1], batch[2]),
        None if table_rows is None else (0, table_rows),
    )


def program_tensors(program: Any) -> tuple[list[ProgramTensor], list[ProgramTensor]]:
    """The program's user inputs and outputs (named ``output``, or ``output<k>`` for several)."""
    import torch

    signature = program.graph_signature
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    tables = {}
    for node in program.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.embedding.default:
            weight, ids = node.args[0], node.args[1]
            tables[ids.name] = int(weight.meta["val"].shape[0])
    inputs = [
        _tensor(name, placeholders[name].meta["val"], program, tables.get(name))
        for name in signature.user_inputs
    ]
    output_node = next(n for n in program.graph.nodes if n.op == "output")
    values = [arg.meta["val"] for arg in output_node.args[0][: len(signature.user_outputs)]]
    names = ["output"] if len(values) == 1 else [f"output{k}" for k in range(len(values))]
    outputs = [_tensor(n, v, program, None) for n, v in zip(names, values, strict=True)]
    return inputs, outputs


def to_json(inputs: list[ProgramTensor], outputs: list[ProgramTensor]) -> bytes:
    return json.dumps(
        {"inputs": [asdict(t) for t in inputs], "outputs": [asdict(t) for t in outputs]}
    ).encode()


def from_json(text: bytes) -> tuple[list[ProgramTensor], list[ProgramTensor]]:
    """The signature ``to_json`` wrote; ``ValueError`` on anything but exactly that."""
    data = json.loads(text)
    if not isinstance(data, dict) or set(data) != {"inputs", "outputs"}:
        raise ValueError("not an object of inputs and outputs")
    found = []
    for kind in ("inputs", "outputs"):
        items = data[kind]
        if not isinstance(items, list) or not 0 < len(items) <= MAX_TENSORS:
            raise ValueError(f"{kind} is not a list of 1 to {MAX_TENSORS} tensors")
        found.append([parse(ProgramTensor, item, f"{kind}[{i}]") for i, item in enumerate(items)])
    return found[0], found[1]
