"""Inside the sandbox: ``python -m exporters.sandbox.child describe|convert``, on ``/in/program.pt2``.

Everything from ``torch.export.load`` on may run the archive's code, and may be made to lie; that is
why it runs here, bounded (``jail``), and why the parent trusts nothing it sends beyond what it checks.
``describe`` sends the program's signature (``found.json``). ``convert`` also reads ``/in/request.json``
(the spec's tensor names) and ``/in/inputs.npz`` (the inputs the parent drew: set ``k``'s input ``i``
as ``k_i``), exports the program to ONNX with the dynamo exporter (opset ``DYNAMO_OPSET``, one file,
fp32) with those names, runs the program on every set and sends ``model.onnx`` and ``outputs.npz``
(set ``k``'s output ``j`` as ``k_j``) beside the signature. A failure the user can act on (a dtype
the spec cannot serve, a program that fails on the spec's inputs) is sent as ``error.json``.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
import warnings

import numpy as np
import torch

from exporters.artifacts.torch_reference import torch_reference
from exporters.sandbox.frames import write_frames
from exporters.sandbox.jail import INPUTS, RESULT_FD_ENV
from exporters.sandbox.program_signature import SignatureError, program_tensors, to_json

# The files of the exchange, named once for both sides: the inputs bound under /in, the results sent.
PROGRAM, REQUEST, ARRAYS = "program.pt2", "request.json", "inputs.npz"
FOUND, ONNX, OUTPUTS, ERROR = "found.json", "model.onnx", "outputs.npz", "error.json"
DYNAMO_OPSET = 18
USER_ERROR = 2  # the exit status that says error.json holds the reason


def _quiet_onnx_export(program: torch.export.ExportedProgram, example: tuple, request: dict) -> bytes:
    """The program as one fp32 ONNX file named as the spec names its tensors. The dynamo exporter
    prints progress and warns about torchvision ops it will not need: kept off the output."""
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        exported = torch.onnx.export(
            program, example, input_names=request["inputs"], output_names=request["outputs"], dynamo=True,
            external_data=False, opset_version=DYNAMO_OPSET,
        )  # fmt: skip
    return exported.model_proto.SerializeToString()


def _input_sets(count: int) -> list[tuple[torch.Tensor, ...]]:
    with np.load(INPUTS / ARRAYS, allow_pickle=False) as arrays:
        sets = sorted({int(key.split("_")[0]) for key in arrays.files})
        return [tuple(torch.from_numpy(arrays[f"{k}_{i}"]) for i in range(count)) for k in sets]


def convert(program: torch.export.ExportedProgram, request: dict) -> dict[str, bytes]:
    """``model.onnx`` and ``outputs.npz`` for the request (see the module's docstring)."""
    sets = _input_sets(len(request["inputs"]))
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
