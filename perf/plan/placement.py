"""Where a strategy's instances go on the GPUs, within each GPU's headroom (docs/PLAN.md, "Placement").
Triton sends an ensemble's next step to whichever instance of the next stage is free, so each replica
of a split is its own set of stage models pinned to its chain of GPUs, and the client spreads requests.
A model that is mostly embedding tables gains nothing from replicas (each holds every table) and may fit
on no single GPU: its tables are packed whole over GPUs by the size-based greedy sharder of DLRM's and
TorchRec's planners (a table too large for every GPU's room is not split row-wise)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from perf.model.links import HOST, Link, Transfer
from perf.model.memory import HEADROOM, MIB, context_bytes
from perf.plan.chains import GREEDY_NOTE, Chains, fastest_chains
from perf.plan.graph_memory import Table, host_memory_bytes
from perf.plan.strategy import StageCost, Strategy
from perf.plan.topology import Topology

CPU_DEVICE = -1  # the device index of a CPU plan


class PlacementError(ValueError):
    """The strategy does not fit the machine; the message says why."""


@dataclass(frozen=True)
class Assignment:
    """One served model of the plan: ``model`` (Triton name), its replica and stage, and its GPUs."""

    model: str
    replica: int
    stage: int
    gpus: tuple[int, ...]
    instances: int  # per GPU


@dataclass(frozen=True)
class Placement:
    assignments: tuple[Assignment, ...]
    memory: dict[int, int]  # device -> bytes the plan puts there
    links: tuple[tuple[Link, ...], ...]  # per replica, the link of each boundary
    routing: str
    tables: dict[int, tuple[str, ...]] = field(default_factory=dict)  # GPU -> its tables
    exchange: Transfer | None = None  # sharded: a request's looked-up rows from the other GPUs


def replica_name(base: str, replica: int, replicas: int) -> str:
    return base if replicas == 1 else f"{base}_r{replica}"


def _within_headroom(topology: Topology, planned: dict[int, int]) -> dict[int, int]:
    """``planned`` plus each used GPU's CUDA context, checked against each GPU's headroom."""
    planned = {d: b + context_bytes(topology.gpu(d).name) for d, b in planned.items()}
    if over := [d for d, needed in planned.items() if not topology.gpu(d).memory.fits(needed)]:
        room = {d: topology.gpu(d).memory.budget_bytes / MIB for d in over}
        details = "; ".join(
            f"GPU{d} needs {planned[d] / MIB:.0f} MiB, has {room[d]:.0f} MiB within 80%" for d in over
        )
        raise PlacementError(f"over memory: {details}")
    return planned


def _chains(topology: Topology, stages: int, replicas: int) -> Chains:
    """``replicas`` disjoint chains of ``stages`` GPUs whose slowest boundary is the fastest possible
    (then the most total bandwidth, then the lowest GPU indices): ``perf.plan.chains`` says how."""
    gpus = topology.indices
    if replicas * stages > len(gpus):
        raise PlacementError(f"needs {replicas * stages} GPUs, the machine has {len(gpus)}")
    speeds = tuple((a, b, topology.link(a, b).gbs) for a, b in itertools.permutations(gpus, 2))
    return fastest_chains(speeds, gpus, stages, replicas)


def _spread(topology: Topology, count: int) -> tuple[int, ...]:
    """``count`` GPUs with the most room, lowest index first among equals."""
    if count > len(topology.gpus):
        raise PlacementError(f"needs {count} GPUs, the machine has {len(topology.gpus)}")
    ranked = sorted(topology.gpus, key=lambda g: (-g.memory.budget_bytes, g.index))
    return tuple(sorted(g.index for g in ranked[:count]))


def split_models(split: str, suffixes: tuple[str, ...], replica: int, replicas: int) -> tuple[str, ...]:
    """The Triton names of a replica's stage models (``PipelineSpec.stage_names``' suffixes)."""
    return tuple(replica_name(split, replica, replicas) + suffix for suffix in suffixes)


def place(
    strategy: Strategy, costs: tuple[StageCost, ...], topology: Topology,
    split: tuple[str, tuple[str, ...]] = ("", ()), tables: tuple[Table, ...] = (),
) -> Placement:  # fmt: skip
    """Put ``strategy`` on ``topology`` (``PlacementError`` where it does not fit); ``split`` is the split's
    pipeline name and its stages' name suffixes. The whole model is served under its cost's name."""
    name, suffixes = split
    if not topology.on_gpu:
        return _place_on_cpu(strategy, costs, split_models(name, suffixes, 0, 1))
    if strategy.kind == "sharded":
        return _place_sharded(strategy, costs[0], topology, tables)
    if strategy.kind == "data":
        gpus = _spread(topology, strategy.replicas)
        per = strategy.instances[0] * costs[0].memory_bytes
        planned = _within_headroom(topology, {g: per for g in gpus})
        assignment = Assignment(costs[0].name, 0, 0, gpus, strategy.instances[0])
        routing = f"one model, its instances on GPUs {list(gpus)}: Triton's batcher feeds them all"
        return Placement((assignment,), planned, ((),), routing)
    found = _chains(topology, strategy.stages, strategy.replicas)
    chains = found.gpus
    planned: dict[int, int] = {}
    assignments = []
    for replica, chain in enumerate(chains):
        for stage, gpu in enumerate(chain):
            planned[gpu] = planned.get(gpu, 0) + strategy.instances[stage] * costs[stage].memory_bytes
            served = split_models(name, suffixes, replica, strategy.replicas)[stage]
            assignments.append(Assignment(served, replica, stage, (gpu,), strategy.instances[stage]))
    planned = _within_headroom(topology, planned)
    links = tuple(tuple(topology.link(a, b) for a, b in itertools.pairwise(chain)) for chain in chains)
    ensembles = [replica_name(name, r, strategy.replicas) for r in range(strategy.replicas)]
    routing = (
        "one ensemble"
        if strategy.replicas == 1
        else f"the client spreads requests over the ensembles {ensembles}"
    ) + ", each replica's stages pinned to their GPUs"
    if not found.exact:
        routing += f"; {GREEDY_NOTE}"
    return Placement(tuple(assignments), planned, links, routing)


def _place_sharded(
    strategy: Strategy, dense: StageCost, topology: Topology, tables: tuple[Table, ...]
) -> Placement:
    """The dense part on ``strategy.replicas`` GPUs, the tables packed whole into the room left."""
    gpus = _spread(topology, strategy.replicas)
    planned = _within_headroom(topology, {g: strategy.instances[0] * dense.memory_bytes for g in gpus})
    room = {g: topology.gpu(g).memory.budget_bytes - planned[g] for g in gpus}
    packed = pack_tables(tables, room, strategy.precision)
    for gpu, found in packed.items():
        planned[gpu] += sum(t.bytes(strategy.precision) for t in found)
    sent = exchange(packed, topology.link, strategy.precision)
    assignments = [Assignment(dense.name, 0, 0, gpus, strategy.instances[0])]
    assignments += [
        Assignment(f"tables {', '.join(t.name for t in packed[g])}", 0, 1, (g,), 1) for g in gpus if packed[g]
    ]
    routing = (
        f"the dense part's instances on GPUs {list(gpus)} behind one batcher; each batch's lookups in "
        f"the tables of other GPUs cross {sent.link.label} ({sent.bytes_per_sample:,.0f} bytes a request)"
    )
    links = ((sent.link,),) if sent.link is not HOST else ((),)
    tables_on = {g: tuple(t.name for t in packed[g]) for g in gpus}
    return Placement(tuple(assignments), planned, links, routing, tables_on, sent)


def _place_on_cpu(
    strategy: Strategy, costs: tuple[StageCost, ...], stage_models: tuple[str, ...]
) -> Placement:
    """A CPU plan: everything within ``HEADROOM`` of this host's memory, boundaries through host memory."""
    names = (costs[0].name,) if strategy.kind == "data" else stage_models
    assignments = tuple(Assignment(names[k], 0, k, (), strategy.instances[k]) for k in range(strategy.stages))
    memory = sum(n * c.memory_bytes for n, c in zip(strategy.instances, costs, strict=True))
    budget = int(HEADROOM * host_memory_bytes())
    if memory > budget:
        raise PlacementError(
            f"over memory: the CPU needs {memory / MIB:.0f} MiB, "
            f"this host has {budget / MIB:.0f} MiB within 80%"
        )
    routing = "one model on the CPU" if strategy.kind == "data" else "one ensemble on the CPU"
    return Placement(assignments, {CPU_DEVICE: memory}, ((HOST,) * (strategy.stages - 1),), routing)


def pack_tables(
    tables: tuple[Table, ...], room: dict[int, int], precision: str
) -> dict[int, tuple[Table, ...]]:
    """Each table, largest first, onto the GPU of ``room`` (bytes free) with the most room left."""
    left = dict(room)
    placed: dict[int, list[Table]] = {gpu: [] for gpu in room}
    for table in sorted(tables, key=lambda t: (-t.bytes(precision), t.name)):
        gpu = min(left, key=lambda g: (-left[g], g))
        needed = table.bytes(precision)
        if needed > left[gpu]:
            rooms = ", ".join(f"GPU{g} {b / MIB:,.0f} MiB" for g, b in sorted(left.items()))
            raise PlacementError(
                f"over memory: table {table.name} ({needed / MIB:,.0f} MiB in {precision}) fits no GPU's "
                f"room left within 80% ({rooms})"
            )
        left[gpu] -= needed
        placed[gpu].append(table)
    return {gpu: tuple(found) for gpu, found in placed.items()}


def exchange(
    packed: dict[int, tuple[Table, ...]], link: Callable[[int, int], Link], precision: str
) -> Transfer:
    """The all-to-all of one request on the worst dense GPU: the bytes of its rows in other GPUs' tables
    (``bytes_per_sample``), over the slowest link among them."""
    found = []
    for gpu in packed:
        others = [g for g, tables in packed.items() if g != gpu and tables]
        remote = sum(t.request_bytes(precision) for g in others for t in packed[g])
        slowest = min((link(g, gpu) for g in others), key=lambda lk: lk.gbs, default=None)
        found.append(Transfer(remote, slowest) if slowest else Transfer(0.0))
    return max(found, key=lambda transfer: transfer.seconds(1))  # the first of equals, as GPUs are listed


def with_exchange(cost: StageCost, transfer: Transfer) -> StageCost:
    """``cost`` with a batch's exchange added (hop latency plus ``N`` rows over the link: linear in ``N``)."""
    one, per_sample = transfer.seconds(1), transfer.seconds(2) - transfer.seconds(1)
    return replace(cost, t_s=cost.t_s + one, dt_s=cost.dt_s + per_sample)
