"""``plan.json`` as types (``perf.saved``), and the plan's ``report.md`` and ``p99_vs_rate.png`` rendered from
it alone: the report and the console read attributes, and a field renamed or of the wrong type fails when
the file is read, naming it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from perf.markdown import number, table, write_report
from perf.measure.measurement import too_few_note
from perf.model.memory import MIB
from perf.plan.placement import CPU_DEVICE, Assignment
from perf.plan.planner import Judged, Plan, curve
from perf.session.search import disagreement
from perf.session.shapes_section import ShapesFigures
from perf.studies.plots import plt, save_figure
from perf.tune.report import section


@dataclass(frozen=True)
class GpuFigures:
    index: int
    name: str
    memory_mib: float


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
    rate: float  # offered, requests/s
    predicted_p99_ms: float
    measured_p99_ms: float
    measured_throughput: float
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
    gpus = tuple(GpuFigures(g.index, g.name, g.memory.total_bytes / MIB) for g in topology.gpus)
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


def top_architectures(plan: Plan, count: int = 3) -> list[Judged]:
    """The best feasible strategy of each architecture (kind, precision, instances, replicas)."""
    best: dict[tuple, Judged] = {}
    for judged in filter(lambda j: j.feasible, plan.judged):
        s = judged.strategy
        best.setdefault((s.kind, s.precision, s.instances, s.replicas), judged)
    return list(best.values())[:count]


def plot(plan: Plan, path: Path) -> Path:
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for judged in top_architectures(plan):
        points = curve(judged, plan.profile, plan.request)
        axes.plot(
            [p.rate for p in points], [p.p99_ms for p in points], marker="o", label=judged.strategy.label
        )
    axes.axhline(plan.request.budget_ms, color="grey", linestyle="--", label="p99 budget")
    axes.set(xlabel="requests/s (predicted)", ylabel="p99 ms (predicted)", yscale="log")
    return save_figure(figure, path, axes)


def rate_sentence(saved: PlanDocument) -> str:
    """The plan's rate and, in the same sentence, whether it was measured or predicted, and from what."""
    chosen = saved.chosen
    origin = saved.compute_origin or f"from {saved.compute_source}"
    predicted = (
        f"predicted {number(chosen.rate, 0)} requests/s {origin} (a prediction)"
        if chosen.rate
        else f"the prediction put it over the budget at every rate {origin} (a prediction; a run held it)"
    )
    if saved.measured_rate:
        return (
            f"measured within the budget up to **{number(saved.measured_rate, 0)} requests/s** on this "
            f"machine (the highest rate a point held it at, by the search's rule); {predicted}"
        )
    return (
        f"up to {number(chosen.rate, 0)} requests/s predicted {origin} (p99 {number(chosen.p99_ms)} ms "
        "there, predicted; not measured)"
    )


def answer(saved: PlanDocument) -> list[str]:
    """The headline: the pick with its rate, or the verdict and that nothing here is an answer."""
    chosen = saved.chosen
    if saved.verdict:
        return [
            f"**No answer: {saved.verdict}.** Nothing below is an answer: no `overlay.yaml` or "
            f"`spec.planned.yaml` was written. The prediction's pick was {chosen.label} "
            f"({number(chosen.rate, 0)} requests/s predicted within the budget {saved.compute_origin}); "
            "no point the server measured held the budget (the table below).",
        ]
    return [
        f"Chosen: **{chosen.label}**: {rate_sentence(saved)}.",
        "",
        f"Requests reach it: {saved.routing}. "
        f"Server flags: `{' '.join(saved.server_flags) or 'none'}`. "
        "The spec overlay is `overlay.yaml` (merged: `spec.planned.yaml`)."
        if saved.overlay_written
        else "No spec overlay was written: a spec cannot yet place a model's tables on other GPUs than its "
        "dense part; the table placement is below and in `plan.json`.",
    ]


def render(folder: Path, saved: PlanDocument) -> Path:
    """``report.md`` from the plan's document alone (the one built, or ``plan.json`` read back)."""
    title = saved.model  # as ``MODEL=`` gave it: a pipeline's says which model it splits
    if saved.asked and saved.asked != saved.model:
        title = f"{saved.asked} (a pipeline splitting {saved.model})"
    chosen = "chosen"
    if saved.measured_rate:
        chosen = f"chosen (measured within the budget up to {number(saved.measured_rate, 0)}/s)"
    lines = [
        f"# Plan: {title}, p99 ≤ {saved.budget_ms:g} ms on {saved.topology.name}",
        "",
        *answer(saved),
        "",
        f"Compute figures: {saved.compute_source}.",
        *([f"\nMemory figures: {saved.memory_source}."] if saved.memory_source else []),
        *(f"\n**Warning**: {w}" for w in saved.topology.warnings),
        *section("Placement", table(
            ["model", "replica", "stage", "GPUs", "instances"],
            [[a.model, a.replica, a.stage, ", ".join(map(str, a.gpus)) or "CPU", a.instances]
             for a in saved.placement],
        )),
        *section(
            "Every strategy",
            "Rates and p99s here are the prediction's (none: no rate predicted within the budget); a reason "
            "that names a measurement (demoted, a lower measured rate) is the server's, the others the "
            "prediction's.",
            table(["strategy", "predicted rate/s", "predicted p99 ms", "memory per device (MiB)", "links",
                   "why it lost"],
                  [[s.label, number(s.rate, 0) if s.rate else "none", number(s.p99_ms) if s.p99_ms else "–",
                    ", ".join(f"{d} {number(m)}" for d, m in s.memory_mib.items()),
                    "; ".join(" ".join(links) for links in s.links if links) or "–", s.reason or chosen]
                   for s in saved.strategies]),
            "![predicted p99 vs rate](p99_vs_rate.png)",
        ),
    ]  # fmt: skip
    if saved.verification:
        lines += section(
            "Predicted vs measured on this machine",
            "Every point the server measured (the probe's runs of a strategy, the search's, the shapes "
            "step's re-measure): the last run's figures, how many runs the point had and what the search's "
            "rule made of them (a miss alone stays open; a point holds when more of its runs met the budget "
            "than missed; a run whose p99 rests on too few requests, marked so, counts as a miss); where a "
            "point's runs disagree, each run's p99 in the order measured.",
            table(["strategy", "rate/s", "p99 predicted", "p99 measured", "served/s", "runs", "point"],
                  [[v.strategy, number(v.rate, 0), number(v.predicted_p99_ms), v.measured_p99_text,
                    number(v.measured_throughput, 0), v.runs, v.point_text]
                   for v in saved.verification]),
        )  # fmt: skip
    if saved.shapes:
        lines += ["", *saved.shapes.section]
    return write_report(folder / "report.md", lines)
