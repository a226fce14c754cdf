"""Run one load shape against one ``Caller`` until told to stop, appending a record per request.

The only code that decides when requests leave. Closed loop: ``concurrency`` workers, each sending the
next request as soon as its last one returns. Open loop: requests leave at their arrival times, late or
not (a late send still counts its latency from the arrival), with ``collect`` arrivals gathered into
one request for static batching; an arrival that finds every slot busy is shed and recorded as failed.
"""

from __future__ import annotations

import asyncio
import time

from perf.measure.loads import Load
from perf.measure.records import Record
from perf.measure.target import Caller


async def drive(caller: Caller, load: Load, stop: asyncio.Event, sink: list[Record]) -> None:
    """Generate ``load`` until ``stop`` is set, then wait for every request in flight."""
    if load.kind == "closed":
        await _closed(caller, load.concurrency, stop, sink)
    else:
        await _open(caller, load, stop, sink)


async def _closed(caller: Caller, concurrency: int, stop: asyncio.Event, sink: list[Record]) -> None:
    collect = caller.target.collect
    # Static batching sends whole batches: `concurrency` samples in flight = concurrency/collect requests.
    workers = max(1, concurrency // collect)

    async def worker() -> None:
        while not stop.is_set():
            sink.append(await caller.call(collect))

    await asyncio.gather(*(worker() for _ in range(workers)))


async def _open(caller: Caller, load: Load, stop: asyncio.Event, sink: list[Record]) -> None:
    assert load.arrivals is not None
    collect = caller.target.collect
    pending: set[asyncio.Task] = set()
    group: list[float] = []

    async def send(arrivals: tuple[float, ...], slot: int) -> None:
        try:
            sink.append(await caller.call(len(arrivals), arrivals, slot))
        finally:
            caller.free.put_nowait(slot)

    start = time.perf_counter() - caller.t0
    for offset in load.arrivals():
        arrival = start + offset
        delay = arrival - (time.perf_counter() - caller.t0)
        while delay > 0 and not stop.is_set():  # short naps so a sparse trace still stops promptly
            await asyncio.sleep(min(delay, 0.05))
            delay = arrival - (time.perf_counter() - caller.t0)
        if stop.is_set():
            break
        group.append(arrival)
        if len(group) < collect:
            continue
        arrivals, group = tuple(group), []
        if caller.free.empty():
            sink.append(caller.shed(arrivals))
            continue
        task = asyncio.create_task(send(arrivals, caller.free.get_nowait()))
        pending.add(task)
        task.add_done_callback(pending.discard)
    if pending:
        await asyncio.gather(*pending)
