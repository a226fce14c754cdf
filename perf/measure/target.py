"""What to load and how to call it: ``Target`` and ``Caller``, the one place that times every request.
Inputs are made once and shared-memory regions sized once, so the client spends its CPU on sending and
nothing grows during a run."""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import tritonclient.grpc.aio as grpc_aio
import tritonclient.http.aio as http_aio
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import np_to_triton_dtype

from exporters.schema.models import ModelSpec
from exporters.sources.inputs import draw_inputs
from perf.errors import OptionError, StudyError
from perf.measure.records import SHED, Record
from perf.measure.shapes import ShapePlan, has_variable_axis, shape_plan
from python_backend.dtypes import DTYPES

log = logging.getLogger(__name__)
PROTOCOLS = {"grpc": grpc_aio, "http": http_aio}
MAX_IN_FLIGHT = 256  # an open loop's requests in flight, whichever engine sends them (beyond: shed or late)


@dataclass(frozen=True)
class Target:
    """One served model to load. ``collect`` > 1 batches samples client-side (static batching)."""

    model: str
    url: str
    inputs: dict[str, np.ndarray]  # a pool of rows; dim 0 is the batch axis
    output_row_bytes: dict[str, int]  # bytes of one sample of each output
    protocol: str = "grpc"
    collect: int = 1
    shared_memory: bool = False
    max_in_flight: int = MAX_IN_FLIGHT  # open loop: arrivals beyond this are shed and recorded as failures
    cycle: bool = False  # each request takes the next rows (rows that differ in cost are all sent)
    shapes: ShapePlan | None = None  # requests at the lengths the traffic takes (variable axes)

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise OptionError(f"protocol must be one of {sorted(PROTOCOLS)}, got {self.protocol!r}")
        if self.cycle and self.shared_memory:
            raise OptionError("cycling through the input pool needs inputs in the request (no --shm)")
        if self.shapes is not None and (self.shared_memory or self.cycle):
            raise OptionError("requests of varying lengths need inputs in the request (no --shm, no cycle)")
        rows = {a.shape[0] for a in self.inputs.values()}
        if len(rows) != 1 or min(rows) < self.collect:
            raise OptionError(f"input pool needs equal rows >= collect ({self.collect}), got {rows}")


def target_from_spec(
    spec: ModelSpec, url: str, protocol: str = "grpc", collect: int = 1, shared_memory: bool = False,
    seed: int = 0, rows: int | None = None, vary_shapes: bool = True, buckets: tuple[int, ...] | None = None,
) -> Target:  # fmt: skip
    """A ``Target`` for a model of the spec, inputs drawn as the exporters draw them; a variable axis at
    the traffic's lengths padded to ``buckets`` (default: the spec's) unless ``vary_shapes`` is False
    or with shared memory, whose regions are sized once."""
    rows = rows or max(collect, 1)
    plan = None
    if vary_shapes and has_variable_axis(spec):
        if shared_memory:
            log.warning("%s: with shared memory every request is sent at one length", spec.name)
        else:
            plan = shape_plan(spec, rows, seed, spec.buckets if buckets is None else buckets)
            log.info("%s: requests at %s", spec.name, plan.describe())
    if plan is not None:  # the pool at the median length sent, for consumers that send one shape
        sent = sorted(s for _, s in plan.requests)
        arrays = [plan.pools[sent[len(sent) // 2]][t.name] for t in spec.inputs]
    else:
        arrays = draw_inputs(spec, rows, seed)
    outputs = {t.name: int(np.prod(t.largest)) * DTYPES[t.dtype].numpy_dtype().itemsize for t in spec.outputs}
    inputs = {t.name: np.ascontiguousarray(a) for t, a in zip(spec.inputs, arrays, strict=True)}
    return Target(spec.name, url, inputs, outputs, protocol, collect, shared_memory, shapes=plan)


def _connect(target: Target, slots: int) -> Any:
    limit = {"conn_limit": slots} if target.protocol == "http" else {}
    return PROTOCOLS[target.protocol].InferenceServerClient(target.url, **limit)


class Caller:
    """An open asyncio client for one ``Target`` (``async with``); ``await call(batch, arrivals)`` gives
    a ``Record``. ``slots`` bounds the requests in flight; ``connect`` opens the client (a test hands
    in its own)."""

    def __init__(
        self, target: Target, t0: float, label: str = "", slots: int | None = None,
        connect: Callable[[Target, int], Any] | None = None,
    ) -> None:  # fmt: skip
        self.target = target
        self.t0 = t0
        self.label = label
        self.module = PROTOCOLS[target.protocol]
        self.slot_count = slots or target.max_in_flight
        self.connect = connect or _connect
        self.client: Any = None
        self.attempts = 0  # calls started plus arrivals shed; every one ends as exactly one record
        self.free: asyncio.Queue[int] = asyncio.Queue()
        self._regions: list[tuple[str, Any]] = []
        self._inputs: dict[tuple[int, int, int], tuple[list[Any], int]] = {}
        self._next_row = 0  # with ``target.cycle``: the pool row the next request starts at
        self._next_shape = 0  # with ``target.shapes``: the index of the next request's lengths

    async def __aenter__(self) -> Caller:
        self.client = self.connect(self.target, self.slot_count)
        for slot in range(self.slot_count):
            self.free.put_nowait(slot)
        if self.target.shared_memory:
            try:
                await self._register_regions()
            except BaseException:  # no __aexit__ follows a failed __aenter__: free what was made
                await self.__aexit__(None, None, None)
                raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """Unregister and destroy every region, even when the server is gone, then close the client."""
        try:
            for name, handle in self._regions:
                try:
                    await self.client.unregister_system_shared_memory(name)
                except Exception:  # e.g. the server died: the region is still ours to destroy
                    log.warning("could not unregister shared memory region %s", name, exc_info=True)
                finally:
                    shm.destroy_shared_memory_region(handle)
            self._regions.clear()
        finally:
            await self.client.close()

    async def _region(self, byte_size: int) -> str:
        """A new registered region; ``_regions`` holds exactly those registered with the server."""
        name = f"perf_{os.getpid()}_{uuid.uuid4().hex[:10]}"
        handle = shm.create_shared_memory_region(name, f"/{name}", byte_size)
        try:
            await self.client.register_system_shared_memory(name, f"/{name}", byte_size)
        except BaseException:
            shm.destroy_shared_memory_region(handle)
            raise
        self._regions.append((name, handle))
        return name

    async def _register_regions(self) -> None:
        pool = list(self.target.inputs.values())
        self._input_region = await self._region(sum(a.nbytes for a in pool))
        shm.set_shared_memory_region(self._regions[-1][1], pool)
        per_slot = sum(self.target.output_row_bytes.values()) * self.target.collect
        self._output_regions = [await self._region(max(per_slot, 64)) for _ in range(self.slot_count)]

    def _request_inputs(self, batch: int) -> tuple[list[Any], int, int, int]:
        """The next request's ``InferInput``s (built once per sent length, first row and batch), its payload
        bytes, true and sent length (0 for fixed shapes). A static batch of varying lengths is sent at
        the longest of its arrivals' sent lengths; its true length is their mean."""
        plan, pools, start, length, sent = self.target.shapes, self.target.inputs, 0, 0, 0
        if plan is not None:
            count = batch if self.target.collect > 1 else 1
            pairs = [plan.requests[(self._next_shape + k) % len(plan.requests)] for k in range(count)]
            self._next_shape += count
            length, sent = round(sum(n for n, _ in pairs) / count), max(s for _, s in pairs)
            pools = plan.pools[sent]
        elif self.target.cycle:
            rows = len(next(iter(pools.values())))
            start, self._next_row = self._next_row % rows, self._next_row + batch
        key = (sent, start, batch)
        if key not in self._inputs:
            tensors, offset, nbytes = [], 0, 0
            for name, pool in pools.items():
                rows = np.take(pool, range(start, start + batch), axis=0, mode="wrap")
                tensor = self.module.InferInput(name, list(rows.shape), np_to_triton_dtype(rows.dtype))
                if self.target.shared_memory:
                    tensor.set_shared_memory(self._input_region, rows.nbytes, offset=offset)
                else:
                    tensor.set_data_from_numpy(rows)
                tensors.append(tensor)
                offset += pool.nbytes
                nbytes += rows.nbytes
            self._inputs[key] = (tensors, nbytes)
        tensors, nbytes = self._inputs[key]
        return tensors, nbytes, length, sent

    def _request_outputs(self, batch: int, slot: int) -> list[Any] | None:
        if not self.target.shared_memory:
            return None
        outputs, offset = [], 0
        for name, row_bytes in self.target.output_row_bytes.items():
            output = self.module.InferRequestedOutput(name)
            output.set_shared_memory(self._output_regions[slot], row_bytes * batch, offset=offset)
            outputs.append(output)
            offset += row_bytes * batch
        return outputs

    async def call(self, batch: int, arrivals: tuple[float, ...] = (), slot: int | None = None) -> Record:
        """Send one request of ``batch`` samples and time it; never raises for a failed request."""
        self.attempts += 1
        own_slot = slot is None
        slot = await self.free.get() if own_slot else slot
        inputs, sent_bytes, length, sent_length = self._request_inputs(batch)
        outputs = self._request_outputs(batch, slot)
        send = time.perf_counter() - self.t0
        try:
            result = await self.client.infer(self.target.model, inputs, outputs=outputs)
            received = self._received_bytes(result, batch)
            ok, status = True, "ok"
        except Exception as error:  # every failure becomes a record; nothing is dropped
            received, ok, status = 0, False, f"{type(error).__name__}: {error}"[:300]
        recv = time.perf_counter() - self.t0
        if own_slot:
            self.free.put_nowait(slot)
        return Record(
            self.target.model, send, recv, batch, sent_bytes, received, ok, status,
            arrivals or (send,), self.label, length, sent_length,
        )  # fmt: skip

    def shed(self, arrivals: tuple[float, ...]) -> Record:
        """The record of arrivals that found every slot busy: failed, never silently dropped."""
        self.attempts += 1
        now = time.perf_counter() - self.t0
        status = f"{SHED}: {self.slot_count} requests already in flight"
        return Record(self.target.model, now, now, len(arrivals), 0, 0, False, status, arrivals, self.label)

    def _received_bytes(self, result: Any, batch: int) -> int:
        if self.target.shared_memory:
            return sum(self.target.output_row_bytes.values()) * batch
        total = 0
        for name in self.target.output_row_bytes:
            array = result.as_numpy(name)
            if array is None or array.shape[0] != batch:
                raise StudyError(f"output {name!r} missing or of the wrong batch size")
            total += array.nbytes
        return total
