"""The plan measured on the real server (a CPU plan) by the one measured search ``make tune`` uses, every
run evidence keyed by the strategy's label (docs/PLAN.md, "Verification"); a variable-length pick is
measured once more by the tuner's length-bucket runs, whose miss reopens the answer."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from exporters.schema.models import ModelSpec, Spec
from perf.errors import StudyError
from perf.measure.engine import LoadEngine, MeasureSettings
from perf.measure.loads import Load, poisson
from perf.measure.shapes import has_variable_axis
from perf.model.batcher import BatcherConfig
from perf.plan.document import VerificationRow, top_architectures
from perf.plan.planner import Judged, Plan, Predictor, lost_to
from perf.plan.strategy import Strategy, precision_variant, split_variants
from perf.session.model import ModelSession, PipelineSession
from perf.session.probe import ProbeResult
from perf.session.search import Evidence, Server, Verdict, decide, search
from perf.session.shapes_section import ShapesFigures, shapes_step

SETTLE_ROUNDS = 12  # a hang guard: each round searches an answer or refutes one
# A served strategy: its session (entered for the runs) and the configuration it is loaded with.
Serve = Callable[[Strategy], tuple[AbstractContextManager, BatcherConfig]]
# The shapes step on the answer at its rate: one more check of it, whose runs join the evidence.
Recheck = Callable[[Plan, float], object]


def real_server(
    spec: Spec, model: str, engine: LoadEngine, settings: MeasureSettings, workdir: Path
) -> Serve:
    """Each strategy served by a session of its own on the real server (``verify0``, ``verify1``, …)."""
    served = iter(range(1_000))
    base = spec.model(model)

    def serve(strategy: Strategy) -> tuple[AbstractContextManager, BatcherConfig]:
        folder = workdir / f"verify{next(served)}"
        if strategy.kind == "data":
            return data_session(base, strategy, folder, engine, settings)
        pipeline = dataclasses.replace(
            split_variants(spec, model)[strategy.precision], replicas=strategy.instances
        )
        session = PipelineSession(
            Spec(models=(base,), pipelines=(pipeline,)), pipeline.name, strategy.max_batch, folder, engine,
            settings,
        )  # fmt: skip
        return session, BatcherConfig(base.max_batch_size, strategy.delay_us)

    return serve


def data_session(
    base: ModelSpec, strategy: Strategy, folder: Path, engine: LoadEngine, settings: MeasureSettings
) -> tuple[ModelSession, BatcherConfig]:
    """The session that serves a whole-model strategy, and the configuration it is loaded with."""
    variant = precision_variant(base, strategy.precision)
    spec = Spec(models=(variant,))
    session = ModelSession(spec, variant.name, strategy.max_batch, folder, engine, settings)
    return session, BatcherConfig(strategy.max_batch, strategy.delay_us, instances=strategy.instances[0])


def served_by(strategy: Strategy, config: BatcherConfig, precision: str) -> bool:
    """Whether the probe's ``config`` of the whole model (in ``precision``) is ``strategy`` served."""
    one_model = strategy.kind == "data" and strategy.replicas == 1 and strategy.precision == precision
    return one_model and config.batching and strategy.batcher() == config


def probe_evidence(
    evidence: Evidence[str], plan: Plan, probed: ProbeResult, precision: str, model: str
) -> None:
    """The probe's runs as evidence for the whole-model strategy each served (another configuration under
    its own name: it can be the closest run named, never the answer)."""
    for config, run in probed.runs:
        judged = next((j for j in plan.judged if served_by(j.strategy, config, precision)), None)
        key = judged.strategy.label if judged else f"{model} {config.label}"
        evidence.add(key, run.load.rate, run)


def candidates(plan: Plan, evidence: Evidence[str], count: int) -> list[tuple[Judged, float]]:
    """What the verification searches, from which rate: the best architectures predicted within the budget;
    where none is, those a probe run held it with (``Evidence.worth_searching``)."""
    if top := top_architectures(plan, count):
        return [(j, j.rate) for j in top]
    labels = {j.strategy.label: j for j in placed(plan)}
    return [(labels[label], rate) for label, rate in evidence.worth_searching(list(labels), max(count, 1))]


def placed(plan: Plan) -> list[Judged]:
    """The strategies that fit the machine (an answer must be placed), in the plan's order."""
    return [j for j in plan.judged if j.placement is not None]


@contextmanager
def served(judged: Judged, serve: Serve) -> Iterator[Server]:
    """``judged``'s strategy served on a session of its own, prepared with its configuration."""
    session, config = serve(judged.strategy)
    with session as running:
        running.prepare(config)
        yield running


def measure_plan(
    plan: Plan, evidence: Evidence[str], count: int, serve: Serve, step: Callable[[str], None],
    recheck: Recheck | None = None,
) -> tuple[Plan, float]:  # fmt: skip
    """The plan as measured: the candidates searched, the answer settled and checked by ``recheck`` (the
    shapes step), whose miss reopens it; ``NothingMeetsError`` where no point holds."""
    searched: set[str] = set()

    def load_at(rate: float) -> Load:
        return poisson(rate, plan.request.seed)

    def search_from(judged: Judged, start: float) -> None:
        label = judged.strategy.label
        step(f"searching {label} on the real server")
        with served(judged, serve) as running:
            search(running, evidence, label, load_at, start, label=f"plan {label}", step=step)
        searched.add(label)

    for judged, start in candidates(plan, evidence, count):
        search_from(judged, start)
    for _ in range(SETTLE_ROUNDS):
        settled, rate = settle(plan, evidence)
        label = settled.chosen.strategy.label
        if label not in searched:
            search_from(settled.chosen, rate)
        elif opened := evidence.open_below(label, rate):  # a miss at or below it that may stand
            rates = ", ".join(f"{r:,.0f}/s" for r in opened)
            step(f"deciding {label} at {rates}: a run there missed the budget")
            with served(settled.chosen, serve) as running:
                for point in opened:
                    decide(running, evidence, label, point, load_at, f"plan {label}")
        else:
            if recheck is not None:
                recheck(settled, rate)
            if evidence.verdict(label, rate) is Verdict.HOLDS:
                return settled, rate
            step(f"{label} at {rate:,.0f}/s: a later run missed the budget there; the answer is reopened")
    raise StudyError(f"the plan's answer did not settle in {SETTLE_ROUNDS} rounds")


def settle(plan: Plan, evidence: Evidence[str]) -> tuple[Plan, float]:
    """The placed strategy with the best point that holds the budget is the pick, at that rate; the others say
    what measurement made of them (demoted, a lower measured rate, or not measured where measurement
    overturned the prediction's pick), each against this answer (or none): a reason an earlier round wrote
    against another answer does not stay. ``NothingMeetsError`` where no point holds."""
    labels = {j.strategy.label: j for j in placed(plan)}
    label, rate = evidence.best(keys=list(labels), prefer=list(labels)) or ("", 0.0)
    best = labels.get(label)
    for other_label, other in labels.items():
        held, closest = evidence.held_rate(other_label), evidence.closest_miss(keys=[other_label])
        if not held and any(
            evidence.verdict(other_label, r) is Verdict.HOLDS for r in evidence.rates(other_label)
        ):
            refuted = evidence.refuted_at(other_label)
            run = evidence.of(other_label, refuted)[-1]
            other.reason = (
                f"demoted: missed the budget at {refuted:,.0f}/s (p99 {run.p99_ms:,.1f} ms), below rates "
                "a point of it held at: it holds the budget up to no rate measured"
            )
        elif closest is not None and not held:
            _, at, run = closest
            other.reason = (
                f"demoted: measured over the budget at every rate tried (p99 {run.p99_ms:,.1f} ms at "
                f"{at:,.0f}/s" + (f", predicted {other.rate:,.0f}/s within it)" if other.rate else ")")
            )
        elif other is not best and held:
            other.reason = f"lower measured rate: {held:,.0f}/s against {rate:,.0f}/s"
        elif not other.feasible or other_label in evidence.runs:
            continue
        elif best is not None and best is not plan.chosen:
            # its predicted reason compared it with the prediction's pick, which measurement overturned
            other.reason = (
                f"not measured: predicted {other.rate:,.0f}/s, the pick measured within the budget up to "
                f"{rate:,.0f}/s{'; ' + other.link_bound if other.link_bound else ''}"
            )
        elif other is not plan.chosen:
            # no answer overturned the prediction's pick: its comparison, written again (an earlier round's
            # answer may have been another, since fallen)
            other.reason = lost_to(other, plan.chosen)
    if best is None:
        raise evidence.nothing_meets(str)
    best.reason = ""
    return dataclasses.replace(plan, chosen=best), rate


def verification_rows(plan: Plan, evidence: Evidence[str]) -> list[VerificationRow]:
    """One row per point measured of a placed strategy, predicted against measured, in the order measured."""
    rows = []
    for judged in placed(plan):
        label = judged.strategy.label
        if label not in evidence.runs:
            continue
        predictor = Predictor(judged.strategy, plan.profile, judged.placement, plan.request)
        for rate in evidence.runs[label]:
            runs = evidence.of(label, rate)
            last, predicted = runs[-1], predictor.at(rate)
            rows.append(VerificationRow(
                strategy=label, rate=rate, predicted_p99_ms=predicted.p99_ms, measured_p99_ms=last.p99_ms,
                measured_throughput=last.throughput, met=last.meets(plan.request.budget_ms), runs=len(runs),
                verdict=evidence.verdict(label, rate).value, samples=last.samples, too_few=last.too_few,
                runs_p99_ms=tuple(r.p99_ms for r in runs),
                runs_met=tuple(r.meets(plan.request.budget_ms) for r in runs),
            ))  # fmt: skip
    return rows


def plan_shapes(
    base: ModelSpec, plan: Plan, rate: float, engine: LoadEngine, settings: MeasureSettings, workdir: Path,
    step: Callable[[str], None], evidence: Evidence[str],
) -> ShapesFigures | None:  # fmt: skip
    """The shapes section of the pick at ``rate``; None for a fixed-shape model or a split pick."""
    strategy = plan.chosen.strategy
    if not has_variable_axis(base) or rate <= 0:
        return None
    if strategy.kind != "data":
        step(f"shapes: not measured for {strategy.label} (the bucket runs serve the whole model)")
        return None
    session, config = data_session(base, strategy, workdir / "shapes", engine, settings)
    with session:
        return shapes_step(
            session, config, lambda r: poisson(r, plan.request.seed), rate, evidence, strategy.label,
            strategy.label, step, "spec.planned.yaml",
        )  # fmt: skip
