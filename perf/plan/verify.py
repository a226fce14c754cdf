"""The plan checked on the real server, where it can run (a CPU plan): the top architectures built,
served and measured at their predicted rate and below it, through the tuner's sessions
(``perf.session.model.ModelSession`` for the whole model, ``perf.session.pipeline`` for a split)
and its measurement layer: the same runs ``make tune`` makes, side by side with the predictions.

The answer is what was measured (``settle``): of the architectures verified, the one measured to hold
the budget at the highest rate; one that held it at no rate is demoted, however well it was predicted.
Where none held it, ``NothingMeetsError`` names the closest figure measured."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path

from exporters.schema.models import ModelSpec, Spec
from perf.errors import NothingMeetsError
from perf.measure.engine import LoadEngine, MeasureSettings
from perf.measure.loads import poisson
from perf.model.batcher import BatcherConfig
from perf.plan.document import VerificationRow
from perf.plan.planner import Plan, Predictor
from perf.plan.profile import precision_variant, variants
from perf.plan.report import top_architectures
from perf.plan.strategy import Strategy
from perf.session.model import ModelSession
from perf.session.pipeline import PipelineSession

log = logging.getLogger(__name__)
FRACTIONS = (0.7, 1.0)  # of the predicted highest rate within the budget
# Where neither held the budget: at most SEARCH_RUNS more runs, down from the lowest ×SEARCH_STEP, or to
# SERVED_SHARE of the most the server served where that is lower (a prediction twenty times too high is
# searched where the server answered, not a fixed step at a time), until one holds.
SEARCH_STEP, SEARCH_RUNS, SERVED_SHARE = 0.6, 2, 0.8


def verify(
    spec: Spec, model: str, plan: Plan, count: int, engine: LoadEngine, settings: MeasureSettings,
    workdir: Path, step: Callable[[str], None],
) -> list[VerificationRow]:  # fmt: skip
    """The ``count`` best architectures, each at ``FRACTIONS`` of its predicted rate (and, where neither
    held the budget, further down: ``SEARCH_STEP``, ``SERVED_SHARE``): predicted and measured p99, the
    served rate, and whether the budget held."""
    rows = []
    base = spec.model(model)
    for index, judged in enumerate(top_architectures(plan, count)):
        s = judged.strategy
        folder = workdir / f"verify{index}"
        if s.kind == "data":
            session, config = data_session(base, s, folder, engine, settings)
        else:
            pipeline = dataclasses.replace(variants(spec, model).split[s.precision], replicas=s.instances)
            session = PipelineSession(
                Spec(models=(base,), pipelines=(pipeline,)),
                pipeline.name,
                s.max_batch,
                folder,
                engine,
                settings,
            )
            config = BatcherConfig(base.max_batch_size, s.delay_us)
        assert judged.placement is not None
        predictor = Predictor(s, plan.profile, judged.placement, plan.request)
        step(f"verifying {s.label} on the real server")
        with session:
            session.prepare(config)
            fractions = list(FRACTIONS)
            while fractions:
                fraction = fractions.pop(0)
                rate = fraction * judged.rate
                measured = session.measure(poisson(rate, plan.request.seed), f"plan {s.label} @ {rate:.0f}/s")
                predicted = predictor.at(rate)
                rows.append(VerificationRow(
                    strategy=s.label, fraction=fraction, rate=rate,
                    predicted_p99_ms=predicted.p99_ms, measured_p99_ms=measured.p99_ms,
                    predicted_throughput=predicted.throughput, measured_throughput=measured.throughput,
                    sustained=measured.sustained, met=measured.meets(plan.request.budget_ms),
                ))  # fmt: skip
                log.info("%s", rows[-1])
                runs = rows_of(rows, s.label)
                if (
                    not fractions
                    and not measured_rate(rows, s.label)
                    and len(runs) - len(FRACTIONS) < SEARCH_RUNS
                ):
                    served = max(row.measured_throughput for row in runs)
                    lowest = min(row.fraction for row in runs)
                    fractions.append(min(lowest * SEARCH_STEP, SERVED_SHARE * served / judged.rate))
    return rows


def data_session(
    base: ModelSpec, strategy: Strategy, folder: Path, engine: LoadEngine, settings: MeasureSettings
) -> tuple[ModelSession, BatcherConfig]:
    """The session that serves a whole-model strategy (its precision's variant of ``base``) and the
    configuration it is loaded with."""
    variant = precision_variant(base, strategy.precision)
    spec = Spec(models=(variant,))
    session = ModelSession(spec, variant.name, strategy.max_batch, folder, engine, settings)
    return session, BatcherConfig(strategy.max_batch, strategy.delay_us, instances=strategy.instances[0])


def rows_of(rows: Sequence[VerificationRow], label: str) -> list[VerificationRow]:
    return [row for row in rows if row.strategy == label]


def measured_rate(rows: Sequence[VerificationRow], label: str) -> float:
    """The highest rate a verification run of ``label`` held the budget at (0: none did)."""
    return max((row.rate for row in rows_of(rows, label) if row.met), default=0.0)


def settle(plan: Plan, rows: Sequence[VerificationRow]) -> tuple[Plan, float]:
    """The plan as measured: the verified architecture that held the budget at the highest rate (ties:
    the plan's order) becomes the pick, with that rate; the verified ones that held it nowhere are
    demoted, their reason saying so. Raises ``NothingMeetsError`` (the closest figure measured) where
    none held it."""
    budget = plan.request.budget_ms
    verified = [j for j in plan.judged if rows_of(rows, j.strategy.label)]
    for judged in verified:
        if not measured_rate(rows, judged.strategy.label):
            closest = min(rows_of(rows, judged.strategy.label), key=lambda row: row.measured_p99_ms)
            judged.reason = (
                "demoted: measured over the budget at every rate tried (p99 "
                f"{closest.measured_p99_ms:,.1f} ms at {closest.rate:,.0f}/s, predicted "
                f"{judged.rate:,.0f}/s within it)"
            )
    held = [j for j in verified if measured_rate(rows, j.strategy.label)]
    if not held:
        row = min(rows, key=lambda r: r.measured_p99_ms if math.isfinite(r.measured_p99_ms) else math.inf)
        behind = None if row.sustained else row.measured_throughput
        raise NothingMeetsError.closest(budget, row.strategy, row.rate, row.measured_p99_ms, behind)
    best = max(held, key=lambda j: measured_rate(rows, j.strategy.label))  # max keeps the first of a tie
    rate = measured_rate(rows, best.strategy.label)
    if best is not plan.chosen:
        previous = plan.chosen
        if not previous.reason:
            previous.reason = (
                f"lower measured rate: {measured_rate(rows, previous.strategy.label):,.0f}/s against "
                f"{rate:,.0f}/s"
            )
        best.reason = ""
    return dataclasses.replace(plan, chosen=best), rate
