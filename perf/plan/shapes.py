"""Shapes as served for ``make plan``: where the model has a variable axis, the verified pick is served
once more and the same section ``make tune`` runs (``perf.session.shapes_section``) measures it at the
plan's measured operating rate: the traffic at one length, at its own lengths and padded to bucket
candidates, with the formed batches per length and the padding cost. Triton batches only equal
shapes, so the per-length table says what batching the planned rate really rests on. The buckets
chosen go into the plan's overlay only where the choice met the budget, as the tuner's do.

Where no way meets the budget, the run of the way the search sent is one more run of the pick at its
rate: with the plan's ``evidence`` it is counted there, and the point measured again by the search's
rule on the same session.

A split pick (a pipeline) is not measured this way: the section serves one whole model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from exporters.schema.models import ModelSpec
from perf.measure.engine import LoadEngine, MeasureSettings
from perf.measure.loads import poisson
from perf.measure.shapes import has_variable_axis
from perf.plan.document import ShapesFigures
from perf.plan.planner import Plan
from perf.plan.verify import data_session
from perf.session.search import Evidence, decide
from perf.session.shapes_section import shapes_outcome


def plan_shapes(
    base: ModelSpec, plan: Plan, rate: float, engine: LoadEngine, settings: MeasureSettings, workdir: Path,
    step: Callable[[str], None], evidence: Evidence[str] | None = None,
) -> ShapesFigures | None:  # fmt: skip
    """The shapes section of the plan's pick at ``rate`` (the highest verified rate within the budget):
    its report lines and the lengths chosen (``()``: none; None where the choice missed the budget);
    None for a model without a variable axis, or a pick that is not the whole model."""
    strategy = plan.chosen.strategy
    if not has_variable_axis(base) or rate <= 0:
        return None
    if strategy.kind != "data":
        step(f"shapes: not measured for {strategy.label} (the bucket runs serve the whole model)")
        return None
    session, config = data_session(base, strategy, workdir / "shapes", engine, settings)
    load = poisson(rate, plan.request.seed)
    with session:
        outcome = shapes_outcome(
            session, config, load, plan.request.budget_ms, step, written="spec.planned.yaml"
        )
        if evidence is not None and outcome.buckets is None and outcome.as_searched is not None:
            evidence.add(strategy.label, rate, outcome.as_searched)
            session.prepare(config)
            load_at = lambda r: poisson(r, plan.request.seed)  # noqa: E731
            decide(session, evidence, strategy.label, rate, load_at, f"re-measure {strategy.label}")
    return ShapesFigures(outcome.lines, outcome.buckets)
