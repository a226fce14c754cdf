"""Send one inference with named numpy inputs and get named numpy outputs, over HTTP or gRPC,
optionally through system shared memory."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import tritonclient.utils.shared_memory as system_shm
from tritonclient.utils import np_to_triton_dtype, triton_to_np_dtype

from client import shm
from client.connection import model_config, protocol_module
from client.errors import ClientError


def make_inputs(module: Any, arrays: dict[str, np.ndarray]) -> list[Any]:
    """``InferInput``s of ``module`` (tritonclient.http or .grpc) carrying ``arrays`` in the request body."""
    return [
        module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype)).set_data_from_numpy(array)
        for name, array in arrays.items()
    ]


def infer(
    client: Any, protocol: str, model: str, arrays: dict[str, np.ndarray], use_shm: bool = False
) -> dict[str, np.ndarray]:
    """Run ``model`` on ``arrays`` (batch axis first) and return every output its config declares."""
    module = protocol_module(protocol)
    outputs = model_config(client, protocol, model)["output"]
    requested = [module.InferRequestedOutput(o["name"]) for o in outputs]
    if not use_shm:
        result = client.infer(model, make_inputs(module, arrays), outputs=requested)
        return {o["name"]: result.as_numpy(o["name"]) for o in outputs}
    rows = next(iter(arrays.values())).shape[0]
    shapes = [(rows, *(int(d) for d in o["dims"])) for o in outputs]  # dims without the batch axis
    if any(d < 0 for shape in shapes for d in shape):
        raise ClientError(
            f"{model}: an output has a variable axis, its size is unknown before the call; no shm"
        )
    dtypes = [np.dtype(triton_to_np_dtype(o["data_type"].removeprefix("TYPE_"))) for o in outputs]
    out_sizes = [int(np.prod(shape)) * dtype.itemsize for shape, dtype in zip(shapes, dtypes, strict=True)]
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
        places = zip(outputs, dtypes, shapes, offsets[len(arrays) :], strict=False)
        return {
            o["name"]: system_shm.get_contents_as_numpy(handle, dtype, shape, offset=offset).copy()
            for o, dtype, shape, offset in places
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
