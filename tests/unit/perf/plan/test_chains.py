"""The chain search of a split's replicas (``perf.plan.chains``, through ``placement._chains``): the same
answer, ties included, as trying every ordering of the GPUs, on seeded random machines of up to 8 GPUs;
the best slowest link on 16-GPU machines, in few steps; past its budget, the greedy answer, named."""

from __future__ import annotations

import functools
import itertools
import random

import pytest

from perf.model.memory import DeviceMemory
from perf.plan import placement as placement_module
from perf.plan.chains import BUDGET, GREEDY_NOTE, fastest_chains
from perf.plan.placement import _chains, place
from perf.plan.strategy import Strategy
from perf.plan.topology import Gpu, Topology
from tests.unit.perf.plan.test_placement import SPLIT, costs, profile

A100, H100 = "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"
LEVELS = ("NV12", "NV4", "NV2", "PIX", "NODE", "SYS")  # NVLink, a PCIe switch, across sockets


def machine(names: list[str], level: dict[tuple[int, int], str]) -> Topology:
    """GPUs ``names`` with ``level[(a, b)]`` (a < b) between each pair, as ``nvidia-smi topo -m`` reads."""
    gpus = tuple(Gpu(i, name, DeviceMemory(80 * 1024**3)) for i, name in enumerate(names))
    pairs = itertools.permutations(range(len(names)), 2)
    return Topology("test", gpus, {(a, b): level[(min(a, b), max(a, b))] for a, b in pairs})


def random_machine(gpus: int, seed: int) -> Topology:
    """A few link levels drawn per pair; odd seeds mix GPUs, whose PCIe speeds then differ by direction."""
    rng = random.Random(seed)
    levels = rng.sample(LEVELS, rng.randint(1, 3))
    names = [rng.choice((A100, H100)) if seed % 2 else A100 for _ in range(gpus)]
    return machine(names, {(a, b): rng.choice(levels) for a, b in itertools.combinations(range(gpus), 2)})


def every_ordering(topology: Topology, stages: int, replicas: int) -> tuple[tuple[int, ...], ...]:
    """The answer by trying every ordering of the GPUs: each set of chains once (first GPUs increasing),
    the slowest boundary fastest, then the most total bandwidth, then the lowest GPU indices."""
    gbs = {(a, b): topology.link(a, b).gbs for a, b in itertools.permutations(topology.indices, 2)}

    def chains(order: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
        return tuple(order[k : k + stages] for k in range(0, len(order), stages))

    def key(order: tuple[int, ...]) -> tuple:
        every = [gbs[pair] for chain in chains(order) for pair in itertools.pairwise(chain)]
        return (min(every, default=float("inf")), sum(every), [-g for g in order])

    orders = itertools.permutations(topology.indices, replicas * stages)
    return chains(max((o for o in orders if list(o[::stages]) == sorted(o[::stages])), key=key))


def assert_chains(found: tuple[tuple[int, ...], ...], stages: int, replicas: int) -> None:
    used = [gpu for chain in found for gpu in chain]
    assert len(found) == replicas and all(len(chain) == stages for chain in found)
    assert len(used) == len(set(used))  # disjoint
    assert [chain[0] for chain in found] == sorted(chain[0] for chain in found)


def slowest(topology: Topology, found: tuple[tuple[int, ...], ...]) -> float:
    return min(topology.link(a, b).gbs for chain in found for a, b in itertools.pairwise(chain))


@pytest.mark.parametrize(
    ("gpus", "seed"), [(n, seed) for n in range(2, 9) for seed in range(12 if n < 8 else 4)]
)
def test_the_search_gives_what_trying_every_ordering_gives(gpus: int, seed: int) -> None:
    topology = random_machine(gpus, seed)
    for stages in range(1, gpus + 1):
        for replicas in range(1, gpus // stages + 1):
            found, expected = _chains(topology, stages, replicas), every_ordering(topology, stages, replicas)
            assert found.exact and found.gpus == expected, (stages, replicas)


def two_islands() -> Topology:
    """16 GPUs: two 8-GPU NVLink islands (an NVSwitch each) joined across the sockets."""
    level = {(a, b): "NV18" if a // 8 == b // 8 else "SYS" for a in range(16) for b in range(16)}
    return machine([H100] * 16, level)


def bridged_pairs() -> Topology:
    """16 PCIe GPUs, each NVLink-bridged to one neighbour, a PCIe switch per socket of 8, sockets apart."""
    level = {
        (a, b): "NV4" if a // 2 == b // 2 else "PIX" if a // 8 == b // 8 else "SYS"
        for a in range(16)
        for b in range(16)
    }
    return machine([A100] * 16, level)


@pytest.mark.parametrize(("stages", "replicas"), [(2, 8), (4, 4)])
def test_on_two_16_gpu_nvlink_islands_every_boundary_stays_on_nvlink(stages: int, replicas: int) -> None:
    topology = two_islands()
    found = _chains(topology, stages, replicas)
    assert_chains(found.gpus, stages, replicas)
    assert slowest(topology, found.gpus) == topology.link(0, 1).gbs  # the fastest link there is
    assert found.gpus == tuple(tuple(range(k, k + stages)) for k in range(0, 16, stages))  # lowest indices
    assert found.exact and found.steps < BUDGET // 100  # the GPUs of an island count as one kind


def test_on_16_bridged_pcie_gpus_four_stages_cross_one_pcie_link_and_never_the_sockets() -> None:
    """Each GPU has one NVLink peer, so a chain of four has at most two NVLink boundaries: the best
    slowest link is the PCIe switch's, and each chain is a bridged pair, the switch, a bridged pair."""
    topology = bridged_pairs()
    pairs = _chains(topology, 2, 8)
    assert pairs.gpus == tuple((k, k + 1) for k in range(0, 16, 2))
    four = _chains(topology, 4, 4)
    assert_chains(four.gpus, 4, 4)
    assert slowest(topology, four.gpus) == topology.link(1, 2).gbs
    crossed = [[topology.levels[pair] for pair in itertools.pairwise(chain)] for chain in four.gpus]
    assert crossed == [["NV4", "PIX", "NV4"]] * 4
    assert pairs.exact and four.exact and max(pairs.steps, four.steps) < BUDGET // 100


def test_past_its_budget_the_search_gives_the_greedy_answer_and_the_plan_names_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """16 GPUs whose links all differ (NVLink and PCIe drawn at random, a hand-made topology), where the
    exact search takes more than a budget of 500 steps."""
    rng = random.Random(2)
    level = {(a, b): rng.choice(("NV4", "NV2", "PIX")) for a, b in itertools.combinations(range(16), 2)}
    topology = machine([A100] * 16, level)
    speeds = tuple((a, b, topology.link(a, b).gbs) for a, b in itertools.permutations(topology.indices, 2))
    found = fastest_chains(speeds, topology.indices, 4, 4, budget=500)
    assert not found.exact and found.steps == 500
    assert_chains(found.gpus, 4, 4)
    monkeypatch.setattr(placement_module, "fastest_chains", functools.partial(fastest_chains, budget=500))
    hybrid = Strategy("hybrid", "fp32", (1, 1), 8)
    assert place(hybrid, costs(profile(), hybrid), topology, SPLIT).routing.endswith(GREEDY_NOTE)
