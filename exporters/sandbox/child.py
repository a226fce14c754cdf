"""Inside the sandbox: ``python -m exporters.sandbox.child describe|convert`` on ``/in/program.pt2``; and
the one way out of it: the program's signature as JSON (``from_json`` takes back only the exact shape of
a ``ProgramTensor``), the ONNX file and the outputs, as named byte strings in frames on a pipe.

Everything from ``torch.export.load`` on may run the archive's code and may lie: the parent trusts
nothing beyond what it checks, reads only frames of the names it asked for (each once), and no file the
sandbox leaves can reach it. A failure the user can act on is sent as ``error.json``."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import struct
import sys
import warnings
from dataclasses import asdict, dataclass
from typing import Any, BinaryIO

import numpy as np
import torch

from exporters.artifacts.torch_reference import torch_reference
from exporters.errors import SpecError
from exporters.sandbox.jail import INPUTS, RESULT_FD_ENV
from exporters.schema.sections import MODEL_DTYPES, VARIABLE
from exporters.schema.typed import check_fields, parse
from python_backend.dtypes import DTYPES

# The files of the exchange, named once for both sides: the inputs bound under /in, the results sent.
PROGRAM, REQUEST, ARRAYS = "program.pt2", "request.json", "inputs.npz"
FOUND, ONNX, OUTPUTS, ERROR = "found.json", "model.onnx", "outputs.npz", "error.json"
DYNAMO_OPSET = 18
USER_ERROR = 2  # the exit status that says error.json holds the reason
MAGIC = b"SANDBOX1"
HEADER = struct.Struct("<HQ")  # name length, byte count
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


class FrameError(ValueError):
    """What came out of the sandbox is not frames of the expected files."""


def write_frames(stream: BinaryIO, files: dict[str, bytes]) -> None:
    stream.write(MAGIC)
    for name, data in files.items():
        raw = name.encode()
        stream.write(HEADER.pack(len(raw), len(data)) + raw)
        stream.write(data)
    stream.flush()


def read_frames(data: bytes, allowed: frozenset[str]) -> dict[str, bytes]:
    """The files in ``data``; ``FrameError`` unless every name is in ``allowed`` and appears once."""
    if not data.startswith(MAGIC):
        raise FrameError("it sent no results (the output does not start with the sandbox's frame marker)")
    files: dict[str, bytes] = {}
    position = len(MAGIC)
    while position < len(data):
        if position + HEADER.size > len(data):
            raise FrameError("its output ends inside a frame header")
        name_length, size = HEADER.unpack_from(data, position)
        position += HEADER.size
        name = data[position : position + name_length].decode("utf-8", errors="replace")
        position += name_length
        if name not in allowed or name in files:
            raise FrameError(f"it sent a file {name[:80]!r} that was not asked for, or twice")
        if position + size > len(data):
            raise FrameError(f"its output ends inside {name!r}")
        files[name] = data[position : position + size]
        position += size
    return files


def _quiet_onnx_export(program: torch.export.ExportedProgram, example: tuple, request: dict) -> bytes:
    """The program as one fp32 ONNX file with the spec's tensor names, the exporter's chatter kept off."""
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        exported = torch.onnx.export(
            program, example, input_names=request["inputs"], output_names=request["outputs"], dynamo=True,
            external_data=False, opset_version=DYNAMO_OPSET,
        )  # fmt: skip
    return exported.model_proto.SerializeToString()


def convert(program: torch.export.ExportedProgram, request: dict) -> dict[str, bytes]:
    with np.load(INPUTS / ARRAYS, allow_pickle=False) as arrays:  # set k's input i as k_i
        keys = sorted({int(key.split("_")[0]) for key in arrays.files})
        positions = range(len(request["inputs"]))
        sets = [tuple(torch.from_numpy(arrays[f"{k}_{i}"]) for i in positions) for k in keys]
    module = program.module()
    outputs = {}
    for k, inputs in enumerate(sets):
        try:
            results = torch_reference(module, [t.numpy() for t in inputs])
        except Exception as error:  # the program's own forward, on the spec's inputs
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            given = ", ".join(
                f"{n}: {list(t.shape)} {t.dtype}" for n, t in zip(request["inputs"], inputs, strict=True)
            )
            problem = f"{type(error).__name__}: {first}"
            raise SignatureError(
                f"the program fails on the inputs the spec declares ({given}): {problem}"
            ) from error
        outputs.update({f"{k}_{j}": array for j, array in enumerate(results)})
    buffer = io.BytesIO()
    np.savez(buffer, **outputs)
    return {ONNX: _quiet_onnx_export(program, sets[0], request), OUTPUTS: buffer.getvalue()}


def main(mode: str) -> int:
    logging.basicConfig(level=logging.WARNING)
    with os.fdopen(int(os.environ[RESULT_FD_ENV]), "wb") as result:
        try:
            program = torch.export.load(str(INPUTS / PROGRAM))
            files = {FOUND: to_json(*program_tensors(program))}
            if mode == "convert":
                files.update(convert(program, json.loads((INPUTS / REQUEST).read_text())))
        except SignatureError as error:
            write_frames(result, {ERROR: json.dumps({"problem": str(error)}).encode()})
            return USER_ERROR
        write_frames(result, files)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
