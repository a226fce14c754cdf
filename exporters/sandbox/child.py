"""Inside the sandbox: ``python -m exporters.sandbox.child describe|convert``, on ``/in/program.pt2``;
and the one way out of it, named byte strings in frames on a pipe.

Everything from ``torch.export.load`` on may run the archive's code and may lie, so the parent trusts
nothing sent beyond what it checks. ``describe`` sends the signature (``found.json``); ``convert`` also
exports the program to ONNX (dynamo, one fp32 file) with the names in ``/in/request.json`` and runs it on
``/in/inputs.npz`` (set ``k``'s input ``i`` as ``k_i``), sending ``model.onnx`` and ``outputs.npz``. A
failure the user can act on is sent as ``error.json``. The sandbox has no folder the parent reads, so no
file it leaves (a link to a secret, a million files) can reach the parent: ``read_frames`` accepts only
the names asked for, each once.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import struct
import sys
import warnings
from typing import BinaryIO

import numpy as np
import torch

from exporters.artifacts.torch_reference import torch_reference
from exporters.sandbox.jail import INPUTS, RESULT_FD_ENV
from exporters.sandbox.program_signature import SignatureError, program_tensors, to_json

# The files of the exchange, named once for both sides: the inputs bound under /in, the results sent.
PROGRAM, REQUEST, ARRAYS = "program.pt2", "request.json", "inputs.npz"
FOUND, ONNX, OUTPUTS, ERROR = "found.json", "model.onnx", "outputs.npz", "error.json"
DYNAMO_OPSET = 18
USER_ERROR = 2  # the exit status that says error.json holds the reason
MAGIC = b"SANDBOX1"
HEADER = struct.Struct("<HQ")  # name length, byte count


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
    """The program as one fp32 ONNX file named as the spec names its tensors, the exporter's progress and
    warnings kept off the output."""
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
