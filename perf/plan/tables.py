"""Embedding tables spread over GPUs, table-wise, the DLRM way: ``pack_tables`` and ``all_to_all``.

A model that is mostly tables gains nothing from replicas (each holds every table) and may fit on no
single GPU. DLRM's inference serves such a model with its tables placed whole on different GPUs and
its dense part replicated: each request looks its ids up on the GPUs holding the tables and the rows
come back to the GPU running its dense part, an all-to-all exchange per batch.

* **Packing**: greedy, largest table first, each onto the GPU with the most room left (within the
  headroom, ``perf.model.memory``, after what else the plan puts there): the size-based greedy
  sharder of DLRM's and TorchRec's planners. A table larger than every GPU's room is not split
  row-wise here: the strategy is over memory.
* **Cost**: a request served on one GPU receives the rows it looked up in the tables on every other
  GPU (``Table.request_bytes``), over the link between the two (``perf.model.links``); the planner
  predicts the GPU with the most remote bytes over its slowest such link, one transfer per batch
  (``exchange``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from perf.model.links import Link, Transfer
from perf.model.memory import MIB
from perf.plan.graph_memory import Table
from perf.plan.strategy import StageCost


class TablePackingError(ValueError):
    """The tables do not fit the GPUs' room; the message says which table and what was left."""


def pack_tables(
    tables: tuple[Table, ...], room: dict[int, int], precision: str
) -> dict[int, tuple[Table, ...]]:
    """Each table onto one GPU of ``room`` (bytes free per GPU index), largest first, onto the GPU
    with the most room left (lowest index among equals); every GPU in the answer, even an empty one."""
    left = dict(room)
    placed: dict[int, list[Table]] = {gpu: [] for gpu in room}
    for table in sorted(tables, key=lambda t: (-t.bytes(precision), t.name)):
        gpu = min(left, key=lambda g: (-left[g], g))
        needed = table.bytes(precision)
        if needed > left[gpu]:
            rooms = ", ".join(f"GPU{g} {b / MIB:,.0f} MiB" for g, b in sorted(left.items()))
            raise TablePackingError(
                f"table {table.name} ({needed / MIB:,.0f} MiB in {precision}) fits no GPU's room left "
                f"within 80% ({rooms})"
            )
        left[gpu] -= needed
        placed[gpu].append(table)
    return {gpu: tuple(found) for gpu, found in placed.items()}


@dataclass(frozen=True)
class Exchange:
    """The all-to-all of one request as the prediction takes it: the bytes a request's dense GPU
    receives from the others, over the slowest link among them."""

    gpu: int  # the dense GPU with the most remote bytes
    bytes_per_request: float
    transfer: Transfer

    @property
    def link(self) -> Link:
        return self.transfer.link


def exchange(
    packed: dict[int, tuple[Table, ...]], link: Callable[[int, int], Link], precision: str
) -> Exchange:
    """The worst GPU's exchange: for every GPU of ``packed`` (each runs the dense part), the rows its
    requests look up in the tables elsewhere, over the slowest link from those GPUs (``link(a, b)``)."""
    found = []
    for gpu in packed:
        others = [g for g, tables in packed.items() if g != gpu and tables]
        remote = sum(t.request_bytes(precision) for g in others for t in packed[g])
        slowest = min((link(g, gpu) for g in others), key=lambda lk: lk.gbs, default=None)
        found.append(Exchange(gpu, remote, Transfer(remote, slowest) if slowest else Transfer(0.0)))
    return max(found, key=lambda e: e.transfer.seconds(1))  # the first of equals, as GPUs are listed


def with_exchange(cost: StageCost, transfer: Transfer) -> StageCost:
    """``cost`` with a batch's exchange added: ``T + (N-1)·Δt`` plus the hop latency and ``N`` rows'
    bytes over the link (``Transfer.seconds(N)``, linear in ``N``)."""
    one, per_sample = transfer.seconds(1), transfer.seconds(2) - transfer.seconds(1)
    return dataclasses.replace(cost, t_s=cost.t_s + one, dt_s=cost.dt_s + per_sample)
