"""Shared-memory regions for one inference, always unregistered and destroyed afterwards."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

# Triton can still hold a region for a moment after the response arrives ("currently in use", seen
# under load); unregistering waits for it, boundedly, rather than leaving the region registered.
UNREGISTER_TRIES, UNREGISTER_WAIT_S = 40, 0.05


@contextlib.contextmanager
def system_region(client: Any, byte_size: int, name: str = "") -> Iterator[tuple[str, Any]]:
    """A registered system region of ``byte_size`` bytes; yields ``(name, handle)``."""
    name = name or f"tb_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    handle = shm.create_shared_memory_region(name, f"/{name}", byte_size)
    try:
        client.register_system_shared_memory(name, f"/{name}", byte_size)
        try:
            yield name, handle
        finally:
            _unregister(client, name)
    finally:
        shm.destroy_shared_memory_region(handle)


def _unregister(client: Any, name: str) -> None:
    for attempt in range(UNREGISTER_TRIES):
        try:
            client.unregister_system_shared_memory(name)
            return
        except InferenceServerException as error:
            if "currently in use" not in str(error) or attempt == UNREGISTER_TRIES - 1:
                raise
            time.sleep(UNREGISTER_WAIT_S)


@contextlib.contextmanager
def cuda_region(client: Any, byte_size: int, device_id: int = 0) -> Iterator[tuple[str, Any]]:
    """A registered CUDA region of ``byte_size`` bytes on GPU ``device_id`` (tensors stay on the GPU;
    needs tritonclient's ``cuda`` extra); yields ``(name, handle)``."""
    import tritonclient.utils.cuda_shared_memory as cudashm

    name = f"tb_cuda_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    handle = cudashm.create_shared_memory_region(name, byte_size, device_id)
    try:
        client.register_cuda_shared_memory(name, cudashm.get_raw_handle(handle), device_id, byte_size)
        try:
            yield name, handle
        finally:
            client.unregister_cuda_shared_memory(name)
    finally:
        cudashm.destroy_shared_memory_region(handle)
