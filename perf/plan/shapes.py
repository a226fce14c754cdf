"""Shapes as served for ``make plan``: where the model has a variable axis, the verified pick is served
once more and the same section ``make tune`` runs (``perf.session.shapes_section``) measures it at the
plan's measured operating rate: the traffic at one length, at its own lengths and padded to bucket
candidates, with the formed batches per length and the padding cost. Triton batches only equal
shapes, so the per-length table says what batching the planned rate really rests on. The buckets
chosen go into the plan's overlay only where the choice met the budget, as the tuner's do.

Where no way meets the budget, the run of the way the search sent is one more run of the pick at its
rate: it joins the plan's ``evidence``, and the point is measured again by the search's rule on the same
session (``perf.session.shapes_section``), whose miss reopens the answer.

A split pick (a pipeline) is not measured this way: the section serves one whole model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from exporters.schema.models import ModelSpec
from perf.measure.engine import LoadEngine, MeasureSettings
from perf.measure.loads import poisson
from perf.measure.shapes import has_variable_axis
from perf.plan.planner import Plan
from perf.plan.verify import data_session
from perf.session.search import Evidence
from perf.session.shapes_section import ShapesFigures, shapes_step


def plan_shapes(
    base: ModelSpec, plan: Plan, rate: float, engine: LoadEngine, settings: MeasureSettings, workdir: Path,
    step: Callable[[str], None], evidence: Evidence[str],
) -> ShapesFigures | None:  # fmt: skip
    """The shapes section of the plan's pick at ``rate`` (the highest verified rate within the budget):
    its report lines and the lengths chosen (``()``: none; None where the choice missed the budget),
    its run as searched counted in ``evidence`` where that choice missed; None for a model without a
    variable axis, or a pick that is not the whole model."""
    strategy = plan.chosen.strategy
    if not has_variable_axis(base) or rate <= 0:
        return None
    if strategy.kind != "data":
        step(f"shapes: not measured for {strategy.label} (the bucket runs serve the whole model)")
        return None
    session, config = data_session(base, strategy, workdir / "shapes", engine, settings)
    load_at = lambda r: poisson(r, plan.request.seed)  # noqa: E731
    label, written = strategy.label, "spec.planned.yaml"
    with session:
        return shapes_step(session, config, load_at, rate, evidence, label, label, step, written)
