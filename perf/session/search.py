"""The one measured search: at what rate does a served configuration hold a p99 budget? ``make tune``
and ``make plan`` ask it through ``search``; no other module searches rates. The rule (``verdict``), the
ladder and the steps are docs/TUNE.md's "The one measured search": a shared host's noise only adds
latency, so a run that met the budget shows the point holds, and a miss alone decides nothing.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from perf.errors import NothingMeetsError
from perf.measure.loads import Load
from perf.measure.measurement import Measurement, too_few_text

log = logging.getLogger(__name__)
FAR_MISS = 4.0  # a run whose p99 is over this × the budget misses by far
BEHIND = 0.8  # ... as does one that served less than this share of the offered rate
RUNGS = 6  # rungs of the rate ladder per doubling (each 2 ** (1/6) ≈ 1.12× the one below)
UP, DOWN = 2, 3  # first steps after a hold (×1.26) and after a miss (×0.71), in rungs
FLOOR = 1.0  # requests/s: the search goes no lower
MAX_POINTS = 10  # rates a search measures at most (about six from within a factor of four)


class Verdict(enum.Enum):
    HOLDS = "holds"
    MISSES = "misses"
    OPEN = "open"  # one miss alone, or as many met as missed: measured once more


class Server(Protocol):
    """What the search needs of a server: a run of a load on what is prepared now."""

    def measure(self, load: Load, label: str) -> Measurement: ...


def misses_far(run: Measurement, offered: float, budget_ms: float) -> bool:
    """A miss no neighbour's noise explains: p99 over ``FAR_MISS`` × the budget (or none), or less than
    ``BEHIND`` of ``offered`` served."""
    p99 = run.p99_ms
    return not math.isfinite(p99) or p99 > FAR_MISS * budget_ms or run.throughput < BEHIND * offered


def verdict(runs: Sequence[Measurement], offered: float, budget_ms: float) -> Verdict:
    """The rule (module docstring): what ``runs`` of one point at ``offered``/s say."""
    met = sum(1 for run in runs if run.meets(budget_ms))
    missed = len(runs) - met
    if met > missed:
        return Verdict.HOLDS
    far = any(misses_far(run, offered, budget_ms) for run in runs if not run.meets(budget_ms))
    if missed > met and (missed >= 2 or far):
        return Verdict.MISSES
    return Verdict.OPEN


RULE = (
    "a point holds where more of its runs met the budget than missed it, and misses where more missed "
    "(two, or one by far)"
)


def disagreement(p99s: Sequence[float | None], mets: Sequence[bool]) -> str:
    """Where a point's runs disagree: every run's p99 in order, which met, and the rule (else "");
    reports show it so that no run hides behind another of the same point."""
    if len(set(mets)) < 2:
        return ""
    each = ", ".join(
        f"{p99:,.1f} ms {'met' if met else 'missed'}" if p99 is not None and math.isfinite(p99)
        else f"no answer, {'met' if met else 'missed'}"
        for p99, met in zip(p99s, mets, strict=True)
    )  # fmt: skip
    return f"its runs disagree: {each}; {RULE}"


def rung(rate: float) -> float:
    """``rate``'s place on the ladder (a whole number for a rung)."""
    return RUNGS * math.log2(rate)


def at_rung(index: int) -> float:
    return 2.0 ** (index / RUNGS)


def on_ladder(rate: float) -> float:
    """The rung nearest ``rate``."""
    return at_rung(round(rung(rate)))


K = TypeVar("K", bound=Hashable)


@dataclass
class Evidence(Generic[K]):
    """Every run of one tool by configuration (``K``) and rate, in the order measured."""

    budget_ms: float
    runs: dict[K, dict[float, list[Measurement]]] = field(default_factory=dict)

    def add(self, key: K, rate: float, run: Measurement) -> None:
        self.runs.setdefault(key, {}).setdefault(rate, []).append(run)

    def of(self, key: K, rate: float) -> list[Measurement]:
        return self.runs.get(key, {}).get(rate, [])

    def verdict(self, key: K, rate: float) -> Verdict:
        return verdict(self.of(key, rate), rate, self.budget_ms)

    def rates(self, key: K) -> list[float]:
        return sorted(self.runs.get(key, {}))

    def refuted_at(self, key: K) -> float:
        """The lowest rate a point of ``key`` misses at on enough requests (inf: none): no rate above it
        holds, whatever a point higher up held (a batcher waiting out its delay at a light load can
        do worse than at a heavier one)."""
        refuting = (
            rate
            for rate in self.rates(key)
            if self.verdict(key, rate) is Verdict.MISSES
            and any(not run.meets(self.budget_ms) and not run.too_few for run in self.of(key, rate))
        )
        return min(refuting, default=math.inf)

    def held_rate(self, key: K) -> float:
        """The highest point of ``key`` that holds below ``refuted_at`` (0: none)."""
        ceiling = self.refuted_at(key)
        held = (r for r in self.rates(key) if r < ceiling and self.verdict(key, r) is Verdict.HOLDS)
        return max(held, default=0.0)

    def open_below(self, key: K, rate: float) -> list[float]:
        """The points of ``key`` still open at or below ``rate``: a miss there would refute ``rate``."""
        return [r for r in self.rates(key) if r <= rate and self.verdict(key, r) is Verdict.OPEN]

    def best(
        self, keys: Sequence[K] | None = None, at: float | None = None, prefer: Sequence[K] = ()
    ) -> tuple[K, float] | None:
        """The configuration held to the highest rate, and that rate (with a target ``at``: those whose
        point at ``at`` holds); ties go to ``prefer``'s order, then the first measured. None: none holds."""
        if at is not None:
            held = [k for k in (self.runs if keys is None else keys) if self.verdict(k, at) is Verdict.HOLDS]
            keys = [k for k in held if at < self.refuted_at(k)]
        order = {k: index for index, k in enumerate(dict.fromkeys([*prefer, *self.runs]))}
        ranked = sorted(self._held(keys), key=lambda pair: (-pair[1], order[pair[0]]))
        return (ranked[0][0], at if at is not None else ranked[0][1]) if ranked else None

    def _held(self, keys: Sequence[K] | None) -> list[tuple[K, float]]:
        """Each of ``keys`` (default: all) measured and held somewhere, with its held rate."""
        keys = list(self.runs) if keys is None else [k for k in keys if k in self.runs]
        return [(k, rate) for k in keys if (rate := self.held_rate(k)) > 0]

    def worth_searching(self, keys: Sequence[K] | None = None, count: int = 1) -> list[tuple[K, float]]:
        """Where no prediction proposes a search: the configurations held to the highest rates, each with
        that rate, else the closest miss at its rate (measured again before "nothing meets" stands)."""
        if held := sorted(self._held(keys), key=lambda pair: -pair[1]):
            return held[:count]
        closest = self.closest_miss(keys=keys)
        return [(closest[0], closest[1])] if closest is not None else []

    def closest_miss(
        self, at_least: float = 0.0, keys: Sequence[K] | None = None
    ) -> tuple[K, float, Measurement] | None:
        """The run that missed the budget closest (a p99 over it before one that fell behind within it),
        at ``at_least``/s or more where any was measured there."""
        missed = [
            (key, rate, run)
            for key, points in self.runs.items()
            if keys is None or key in keys
            for rate, runs in points.items()
            for run in runs
            if not run.meets(self.budget_ms)
        ]
        if at_least and any(rate >= at_least for _, rate, _ in missed):
            missed = [m for m in missed if m[1] >= at_least]

        def closeness(item: tuple[K, float, Measurement]) -> tuple[bool, float]:
            p99 = item[2].p99_ms
            return (p99 <= self.budget_ms, p99 if math.isfinite(p99) else math.inf)

        return min(missed, key=closeness, default=None)

    def nothing_meets(
        self, name: Callable[[K], str], detail: str = "", at_least: float = 0.0
    ) -> NothingMeetsError:
        """The verdict where no point holds, naming the closest run over the budget."""
        closest = self.closest_miss(at_least)
        if closest is None:
            return NothingMeetsError(
                f"nothing meets p99 <= {self.budget_ms:g} ms here: nothing was measured", detail
            )
        key, rate, run = closest
        behind = None if run.sustained or run.failed else run.throughput  # failures: named as such
        few = run.sustained and run.too_few  # within the budget, on too few requests: say how to accept them
        note = f"{too_few_text(run.samples)}; --p99-samples lowers the count a p99 rests on" if few else ""
        return NothingMeetsError.closest(
            self.budget_ms, name(key), rate, run.p99_ms, behind, detail, note, run.failed
        )


def decide(
    server: Server, evidence: Evidence[K], key: K, rate: float, load_at: Callable[[float], Load], label: str
) -> Verdict:
    """Measure ``key`` (prepared on ``server``) at ``rate`` until the rule decides its point."""
    while (found := evidence.verdict(key, rate)) is Verdict.OPEN:
        run = server.measure(load_at(rate), f"{label} @ {rate:,.0f}/s")
        evidence.add(key, rate, run)
        log.info("%s: p99 %.1f ms, served %.0f/s: %s", run.label, run.p99_ms, run.throughput,
                 evidence.verdict(key, rate).value)  # fmt: skip
    return found


def _bracket(evidence: Evidence[K], key: K) -> tuple[float | None, float | None, Measurement | None]:
    """``key``'s held rate, the lowest decided miss above it, and that miss's last run."""
    held = evidence.held_rate(key) or None
    above = [r for r in evidence.rates(key) if r > (held or 0) and evidence.verdict(key, r) is Verdict.MISSES]
    missed = min(above, default=None)
    return held, missed, evidence.of(key, missed)[-1] if missed is not None else None


def search(
    server: Server, evidence: Evidence[K], key: K, load_at: Callable[[float], Load], start: float, *,
    target: float | None = None, label: str = "search",
    step: Callable[[str], None] | None = None,
) -> list[float]:  # fmt: skip
    """Search the highest rate ``key`` (prepared on ``server``) holds the budget at; every run joins
    ``evidence``. A ``target`` is measured first and a miss there ends it. Returns the rates measured."""
    visited: list[float] = []
    up, down = UP, DOWN
    # the target, a point of ``key`` measured already (again where still open), else the nearest rung
    rate: float | None = target or (start if evidence.of(key, start) else on_ladder(max(start, FLOOR)))
    held, missed, _ = _bracket(evidence, key)
    reopen = bool(evidence.of(key, start)) and evidence.verdict(key, start) is Verdict.OPEN
    if target is None and (held is not None or missed is not None) and not reopen:
        rate = _next(held, missed, None, up, down)  # what is known already steers it
    last: Verdict | None = None
    while rate is not None and len(visited) < MAX_POINTS:
        if step:
            step(f"{label}: {rate:,.0f}/s")
        found = decide(server, evidence, key, rate, load_at, label)
        visited.append(rate)
        if target is not None and rate == target and found is Verdict.MISSES:
            break
        if last is found:  # twice the step in the same direction
            up, down = (2 * up, down) if found is Verdict.HOLDS else (up, 2 * down)
        last = found
        held, missed, miss = _bracket(evidence, key)
        rate = _next(held, missed, miss, up, down)
    return visited


def _next(
    held: float | None, missed: float | None, miss: Measurement | None, up: int, down: int
) -> float | None:
    """The next rate: halfway (in rungs) between a hold and the miss above it, else a step from either."""
    if held is not None and missed is not None:
        first, last = math.floor(rung(held) + 1e-9) + 1, math.ceil(rung(missed) - 1e-9) - 1
        return at_rung((first + last + 1) // 2) if first <= last else None
    if held is not None:
        return at_rung(math.floor(rung(held) + 1e-9) + up)
    if missed is None:
        return None
    index = math.ceil(rung(missed) - 1e-9) - down
    if miss is not None and 0 < miss.throughput < BEHIND * missed:  # fell far behind: from what it served
        index = min(index, math.floor(rung(BEHIND * miss.throughput)))
    rate = at_rung(index)
    return rate if rate >= FLOOR else None
