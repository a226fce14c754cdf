"""Shapes as served for ``make plan``: where the model has a variable axis, the verified pick is served
once more and the same section ``make tune`` runs (``perf.session.shapes_section``) measures it at the
plan's measured operating rate: the traffic at one length, at its own lengths and padded to bucket
candidates, with the formed batches per length and the padding cost. Triton batches only equal
shapes, so the per-length table says what batching the planned rate really rests on. The buckets
chosen go into the plan's overlay only where the choice met the budget, as the tuner's do.

Where no way meets the budget, the run of the way the search sent is one more run of the pick at its
rate: ``confirm`` counts it (and measures the point again by the search's rule) on the same session.

A split pick (a pipeline) is not measured this way: the section serves one whole model."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from exporters.schema.models import ModelSpec
from perf.measure.engine import LoadEngine, MeasureSettings
from perf.measure.loads import poisson
from perf.measure.measurement import Measurement
from perf.measure.shapes import has_variable_axis
from perf.plan.document import ShapesFigures
from perf.plan.planner import Plan
from perf.plan.verify import data_session
from perf.session.model import ModelSession
from perf.session.shapes_section import shapes_outcome

# Where no way met the budget: the session (the pick loaded) and the run of the way the search sent.
Confirm = Callable[[ModelSession, Measurement], None]

log = logging.getLogger(__name__)


def plan_shapes(
    base: ModelSpec, plan: Plan, rate: float, engine: LoadEngine, settings: MeasureSettings, workdir: Path,
    step: Callable[[str], None], confirm: Confirm | None = None,
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
        if confirm and outcome.buckets is None and outcome.as_searched is not None:
            session.prepare(config)
            confirm(session, outcome.as_searched)
    buckets = outcome.buckets
    return ShapesFigures(tuple(outcome.lines), None if buckets is None else tuple(buckets))
