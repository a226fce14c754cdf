"""Which GPUs a split's replicas take (docs/PLAN.md, "Placement"): ``replicas`` disjoint chains of ``stages``
GPUs whose slowest boundary link is as fast as possible, then with the most bandwidth over all boundaries,
then on the lowest GPU indices (the chains listed by first GPU and read as one sequence).

The search is exact, and small on real machines for three reasons:

* the slowest link of the answer is one of the few speeds a machine's links have, so the search tries them
  fastest first, each time keeping only the links at least that fast, and stops at the first that fits;
* GPUs with the same links to every other GPU (the eight behind one NVSwitch, the two of a bridged PCIe
  pair) are interchangeable, so the search counts how many of each kind are left instead of which: an
  8-GPU NVLink island is 9 states, not 256;
* it finishes one island of fast links before it touches the next, so islands add states, not multiply.

A hand-made topology whose GPUs are all different can still make the search large: past ``BUDGET`` steps it
gives the greedy answer instead, and says so (``Chains.exact``, ``GREEDY_NOTE``)."""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

BUDGET = 1_000_000  # steps of the exact search, about a second here
GREEDY_NOTE = (
    f"the chains are the greedy search's: the exact search ran past its {BUDGET:,} steps on this topology, "
    "so chains with faster links may exist (docs/PLAN.md, Placement)"
)
Speeds = dict[tuple[int, int], int]  # (from GPU, to GPU) -> MB/s, whole numbers so that sums compare exactly


@dataclass(frozen=True)
class Chains:
    gpus: tuple[tuple[int, ...], ...]  # by first GPU
    exact: bool  # False: the greedy answer, the exact search having run past its budget
    steps: int  # the exact search's (at most its budget)


class _OverBudgetError(Exception):
    pass


@dataclass
class _Budget:
    left: int

    def spend(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise _OverBudgetError


@functools.lru_cache(maxsize=64)  # the planner places many strategies of one shape on one topology
def fastest_chains(
    links: tuple[tuple[int, int, float], ...],
    gpus: tuple[int, ...],
    stages: int,
    replicas: int,
    budget: int = BUDGET,
) -> Chains:
    """The chains on ``gpus`` (as many as the chains need, or more), ``links`` giving the speed in GB/s from
    each GPU to each other one."""
    speeds = {(a, b): round(gbs * 1000) for a, b, gbs in links}
    spent = _Budget(budget)
    try:
        for floor in sorted(set(speeds.values()), reverse=True) or [0]:
            kept = {pair: speed for pair, speed in speeds.items() if speed >= floor}
            if found := _Search(kept, gpus, stages, spent).lowest_best(replicas):
                return Chains(found, True, budget - spent.left)
    except _OverBudgetError:
        return Chains(_greedy(speeds, gpus, stages, replicas), False, budget)
    raise AssertionError("with every link kept, chains on GPUs enough always fit")


def _greedy(speeds: Speeds, gpus: tuple[int, ...], stages: int, replicas: int) -> tuple[tuple[int, ...], ...]:
    """Chain by chain, the fastest chain of the GPUs left (slowest link, then total, then lowest indices):
    quick, and as good as the exact answer only where the first chains take no GPU the later ones need."""
    left, chains = set(gpus), []
    for _ in range(replicas):
        options = itertools.permutations(sorted(left), stages)
        chain = max(options, key=lambda c: _weigh([speeds[pair] for pair in itertools.pairwise(c)]))
        chains.append(chain)
        left -= set(chain)
    return tuple(sorted(chains))


def _weigh(links: list[int]) -> tuple[float, int]:
    return min(links, default=math.inf), sum(links)


class _Search:
    """The exact search over the links of ``speeds`` (those at the floor tried, or faster)."""

    def __init__(self, speeds: Speeds, gpus: tuple[int, ...], stages: int, budget: _Budget) -> None:
        self.speeds, self.gpus, self.stages, self.budget = speeds, gpus, stages, budget
        self.kind = _kinds(gpus, speeds)
        members = [[g for g in gpus if self.kind[g] == k] for k in range(max(self.kind.values()) + 1)]
        self.out_of: list[list[tuple[int, int]]] = [[] for _ in members]  # kind -> (next kind, speed)
        self.into: list[list[tuple[int, int]]] = [[] for _ in members]  # kind -> (previous kind, speed)
        for a, b in itertools.product(range(len(members)), repeat=2):
            other = next((g for g in members[b] if g != members[a][0]), None)
            if other is not None and (speed := speeds.get((members[a][0], other))) is not None:
                self.out_of[a].append((b, speed))
                self.into[b].append((a, speed))
        self.fastest = max(speeds.values(), default=0)
        self.memo: dict[tuple[tuple[int, ...], int], float] = {}

    def lowest_best(self, replicas: int) -> tuple[tuple[int, ...], ...]:
        """The lowest-index chains among those of the most bandwidth; () where none fit. The most is known
        first; then each chain, in order, is the lowest whose GPUs left can still make up the rest of it.
        The chains still to come need not start after it: a best set in which one starts lower lists
        lower than the chains taken so far, so it would have been taken first."""
        left = set(self.gpus)
        if (target := self.best(self.counts(left), replicas)) == -math.inf:
            return ()
        chains: list[tuple[int, ...]] = []
        for still in range(replicas - 1, -1, -1):
            after = chains[-1][0] if chains else -1
            chain, weight = next(
                (chain, weight)
                for chain, weight in self.gpu_chains(left, after)
                if weight + self.best(self.counts(left - set(chain)), still) == target
            )
            chains.append(chain)
            left, target = left - set(chain), target - weight
        return tuple(chains)

    def counts(self, left: set[int]) -> tuple[int, ...]:
        """How many GPUs of each kind are left."""
        return tuple(sum(self.kind[gpu] == k for gpu in left) for k in range(len(self.out_of)))

    def best(self, counts: tuple[int, ...], chains: int) -> float:
        """The most bandwidth ``chains`` chains on the GPUs ``counts`` holds can have (-inf: they do not fit).
        Take one GPU of the first kind still held: either no chain uses it, or some chain goes through it."""
        if chains == 0:
            return 0
        if sum(counts) < chains * self.stages:
            return -math.inf
        if (counts, chains) not in self.memo:
            first = next(kind for kind, count in enumerate(counts) if count)
            unused = tuple(count - (kind == first) for kind, count in enumerate(counts))
            found = self.best(unused, chains)
            ceiling = chains * (self.stages - 1) * self.fastest  # every link the fastest kept: stop there
            for weight, rest in self.kind_chains(counts, first):
                if found == ceiling:
                    break
                found = max(found, weight + self.best(rest, chains - 1))
            self.memo[(counts, chains)] = found
        return self.memo[(counts, chains)]

    def kind_chains(self, counts: tuple[int, ...], through: int) -> Iterator[tuple[int, tuple[int, ...]]]:
        """Each chain of kinds through ``through`` that ``counts`` holds, grown outward from it (``before``
        kinds ahead of it, the rest after): its bandwidth and the counts it leaves."""
        left = list(counts)
        left[through] -= 1
        for before in range(self.stages):
            yield from self._grow([through], left, 0, before)

    def _grow(
        self, chain: list[int], left: list[int], weight: int, before: int
    ) -> Iterator[tuple[int, tuple[int, ...]]]:
        self.budget.spend()
        if len(chain) == self.stages:
            yield weight, tuple(left)
            return
        for kind, speed in self.into[chain[0]] if before else self.out_of[chain[-1]]:
            if left[kind]:
                left[kind] -= 1
                grown = [kind, *chain] if before else [*chain, kind]
                yield from self._grow(grown, left, weight + speed, max(0, before - 1))
                left[kind] += 1

    def gpu_chains(self, left: set[int], after: int) -> Iterator[tuple[tuple[int, ...], int]]:
        """The chains of real GPUs of ``left`` whose first GPU is above ``after``, lowest indices first."""
        for start in sorted(g for g in left if g > after):
            yield from self._follow((start,), left - {start}, 0)

    def _follow(
        self, chain: tuple[int, ...], left: set[int], weight: int
    ) -> Iterator[tuple[tuple[int, ...], int]]:
        self.budget.spend()
        if len(chain) == self.stages:
            yield chain, weight
            return
        for gpu in sorted(left):
            if (speed := self.speeds.get((chain[-1], gpu))) is not None:
                yield from self._follow((*chain, gpu), left - {gpu}, weight + speed)


def _kinds(gpus: tuple[int, ...], speeds: Speeds) -> dict[int, int]:
    """GPU -> its kind. Two GPUs are of one kind where swapping them changes no link: the same speed to and
    from every other GPU, and between them the same both ways. Kinds are numbered island by island (GPUs
    joined by ``speeds``), so that the search finishes an island before it starts the next."""
    island = {gpu: gpu for gpu in gpus}  # GPU -> the lowest GPU of its island
    for a, b in sorted(speeds):
        if island[a] != island[b]:
            joined = (island[a], island[b])
            island = {gpu: min(joined) if i in joined else i for gpu, i in island.items()}

    def swappable(a: int, b: int) -> bool:
        same = [(a, b, b, a)] + [(a, g, b, g) for g in gpus if g not in (a, b)]
        same += [(g, a, g, b) for g in gpus if g not in (a, b)]
        return all(speeds.get((p, q)) == speeds.get((r, s)) for p, q, r, s in same)

    kind: dict[int, int] = {}
    for gpu in sorted(gpus, key=lambda g: (island[g], g)):
        alike = (kind[other] for other in kind if swappable(gpu, other))
        kind[gpu] = next(alike, max(kind.values(), default=-1) + 1)
    return kind
