"""``plan.json`` as types (``perf.saved``): the report and the console read attributes, and a field
renamed or of the wrong type fails when the file is read, naming it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from perf.markdown import number
from perf.measure.measurement import too_few_note
from perf.model.memory import MIB
from perf.plan.placement import CPU_DEVICE, Assignment
from perf.plan.planner import Judged, Plan
from perf.session.search import disagreement
from perf.session.shapes_section import ShapesFigures


@dataclass(frozen=True)
class GpuFigures:
    index: int
    name: str
    memory_mib: float
    used_mib: float  # already in use when the topology was read


@dataclass(frozen=True)
class TopologyFigures:
    name: str
    gpus: tuple[GpuFigures, ...]  # none: the CPU
    warnings: tuple[str, ...]


@dataclass(frozen=True)
class StrategyFigures:
    """One strategy as planned: what it is, where it went, what it is predicted to do, why it lost."""

    label: str
    kind: str
    precision: str
    instances: tuple[int, ...]
    replicas: int
    delay_us: int
    max_batch: int
    devices: int
    rate: float  # predicted, all replicas together, within the budget
    p99_ms: float | None  # there; None: nothing within the budget
    memory_mib: dict[str, float]  # "GPU0" / "CPU" -> MiB the plan puts there
    links: tuple[tuple[str, ...], ...]  # per replica, the link of each boundary
    max_rel_error: float
    link_bound: str
    reason: str  # empty for the pick


@dataclass(frozen=True)
class VerificationRow:
    """One point measured on the real server: predicted against its last run, its runs and verdict."""

    strategy: str  # the strategy's label
    fraction: float  # of its predicted rate (0: none was predicted within the budget)
    rate: float  # offered, requests/s
    predicted_p99_ms: float
    measured_p99_ms: float
    predicted_throughput: float
    measured_throughput: float
    sustained: bool  # the server kept up with the offered rate (the last run)
    met: bool  # the last run was within the budget (and sustained, on enough requests)
    runs: int = 1
    verdict: str = ""  # holds / misses / open: the point, by the search's rule
    samples: int = 0  # the requests the last run's p99 rests on
    too_few: bool = False  # too few of them to meet the budget by (``Measurement.too_few``)
    runs_p99_ms: tuple[float, ...] = ()  # every run's p99 in the order measured (the last: measured's)
    runs_met: tuple[bool, ...] = ()  # ... and whether it met the budget

    @property
    def point_text(self) -> str:
        """What the search's rule made of the point, with each run's p99 where its runs disagree."""
        verdict = self.verdict or ("holds" if self.met else "misses")
        disagree = disagreement(self.runs_p99_ms, self.runs_met)
        return f"{verdict}: {disagree}" if disagree else verdict

    @property
    def measured_p99_text(self) -> str:
        """The measured p99 (ms), saying so where it rests on too few requests to meet the budget."""
        return number(self.measured_p99_ms) + too_few_note(self.samples, self.too_few)


@dataclass(frozen=True)
class PlanDocument:
    """``plan.json``: every figure of one ``make plan`` run."""

    model: str
    budget_ms: float
    max_rel_error: float | None  # None: any accuracy
    topology: TopologyFigures
    compute_source: str
    memory_source: str
    chosen: StrategyFigures
    placement: tuple[Assignment, ...]
    routing: str  # how requests reach the replicas
    server_flags: tuple[str, ...]
    strategies: tuple[StrategyFigures, ...]  # best first, the pick among them
    verification: tuple[VerificationRow, ...]  # empty: nothing served (not this host, or too big)
    seconds: float
    verdict: str | None  # set: nothing measured held the budget, and nothing here is an answer
    measured_rate: float | None  # the highest verified rate within the budget (None: unverified)
    overlay_written: bool  # overlay.yaml and spec.planned.yaml were written
    shapes: ShapesFigures | None  # None: fixed shapes, a split pick, or unverified
    asked: str = ""  # MODEL= as given: ``model`` itself, or a pipeline of the spec that splits it
    # where the compute behind every predicted rate was measured, against the machine planned for:
    # "from compute measured on this host's CPU, not on the 4× NVIDIA RTX A6000 named"
    compute_origin: str = ""


def strategy_figures(judged: Judged) -> StrategyFigures:
    s, placement = judged.strategy, judged.placement
    return StrategyFigures(
        label=s.label, kind=s.kind, precision=s.precision, instances=s.instances, replicas=s.replicas,
        delay_us=s.delay_us, max_batch=s.max_batch, devices=s.devices, rate=judged.rate,
        p99_ms=judged.best.p99_ms if judged.best else None,
        memory_mib={"CPU" if d == CPU_DEVICE else f"GPU{d}": b / MIB for d, b in placement.memory.items()}
        if placement else {},
        links=tuple(tuple(lk.label for lk in links) for links in placement.links) if placement else (),
        max_rel_error=judged.error, link_bound=judged.link_bound, reason=judged.reason,
    )  # fmt: skip


def plan_document(
    plan: Plan, flags: Sequence[str], verification: Sequence[VerificationRow], seconds: float, *,
    verdict: str | None = None, measured_rate: float | None = None, overlay_written: bool = False,
    shapes: ShapesFigures | None = None, asked: str = "", compute_origin: str = "",
) -> PlanDocument:  # fmt: skip
    """The document of ``plan`` (its pick placed) with what the run measured."""
    chosen, topology = plan.chosen, plan.topology
    assert chosen.placement is not None
    gpus = tuple(
        GpuFigures(g.index, g.name, g.memory.total_bytes / MIB, g.memory.used_bytes / MIB)
        for g in topology.gpus
    )
    return PlanDocument(
        model=plan.profile.model, budget_ms=plan.request.budget_ms, max_rel_error=plan.request.max_error,
        topology=TopologyFigures(topology.name, gpus, tuple(topology.warnings)),
        compute_source=plan.profile.compute_source, memory_source=plan.profile.memory_source,
        chosen=strategy_figures(chosen), placement=chosen.placement.assignments,
        routing=chosen.placement.routing, server_flags=tuple(flags),
        strategies=tuple(strategy_figures(j) for j in plan.judged), verification=tuple(verification),
        seconds=seconds, verdict=verdict, measured_rate=measured_rate, overlay_written=overlay_written,
        shapes=shapes, asked=asked or plan.profile.model, compute_origin=compute_origin,
    )  # fmt: skip
