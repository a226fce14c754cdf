"""Send one inference with named numpy inputs and get named numpy outputs, over HTTP or gRPC,
optionally through system shared memory."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import tritonclient.utils.shared_memory as system_shm
from tritonclient.utils import np_to_triton_dtype, triton_to_np_dtype

from client import shm
from client.connection import model_config, protocol_module
from client.errors import ClientError


@dataclass(frozen=True)
class OutputInfo:
    name: str
    dtype: np.dtype
    dims: tuple[int, ...]


def output_infos(config: dict[str, Any]) -> list[OutputInfo]:
    """Outputs as the config declares them (dims without the batch axis when batching is on)."""
    return [
        OutputInfo(
            o["name"],
            np.dtype(triton_to_np_dtype(o["data_type"].removeprefix("TYPE_"))),
            tuple(int(d) for d in o["dims"]),
        )
        for o in config["output"]
    ]


def make_inputs(module: Any, arrays: dict[str, np.ndarray]) -> list[Any]:
    """``InferInput``s of ``module`` (tritonclient.http or .grpc) carrying ``arrays`` in the request body."""
    return [
        module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype)).set_data_from_numpy(array)
        for name, array in arrays.items()
    ]


def infer(
    client: Any, protocol: str, model: str, arrays: dict[str, np.ndarray], use_shm: bool = False
) -> dict[str, np.ndarray]:
    """Run ``model`` on ``arrays`` (batch axis first) and return every declared output."""
    module = protocol_module(protocol)
    outputs = output_infos(model_config(client, protocol, model))
    requested = [module.InferRequestedOutput(o.name) for o in outputs]
    if not use_shm:
        result = client.infer(model, make_inputs(module, arrays), outputs=requested)
        return {o.name: result.as_numpy(o.name) for o in outputs}
    if any(d < 0 for o in outputs for d in o.dims):
        raise ClientError(
            f"{model}: an output has a variable axis, its size is unknown before the call; no shm"
        )
    rows = next(iter(arrays.values())).shape[0]
    out_sizes = [rows * int(np.prod(o.dims)) * o.dtype.itemsize for o in outputs]
    sizes = [a.nbytes for a in arrays.values()] + out_sizes
    offsets = list(itertools.accumulate(sizes, initial=0))  # the inputs back to back, then the outputs
    with shm.system_region(client, offsets[-1]) as (region, handle):
        system_shm.set_shared_memory_region(handle, list(arrays.values()))  # back to back from offset 0
        tensors = [
            module.InferInput(n, list(a.shape), np_to_triton_dtype(a.dtype)) for n, a in arrays.items()
        ]
        for tensor, size, offset in zip([*tensors, *requested], sizes, offsets, strict=False):
            tensor.set_shared_memory(region, size, offset)
        client.infer(model, tensors, outputs=requested)
        return {
            o.name: shm.read_output(handle, o.dtype, (rows, *o.dims), offset)
            for o, offset in zip(outputs, offsets[len(arrays) :], strict=False)
        }


def timed_calls(call: Callable[[], object], count: int, warmup: int) -> list[float]:
    """Milliseconds of each of ``count`` calls, one after another, after ``warmup`` untimed."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(count):
        began = time.perf_counter()
        call()
        times.append((time.perf_counter() - began) * 1e3)
    return times
