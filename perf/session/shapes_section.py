"""The choice of length buckets for a model with a variable axis, as a report section: ``make tune``
runs it on its pick, ``make plan`` on its verified pick, each at its measured operating rate.

The tuner and the planner measure such a model at the lengths its traffic takes (``perf.session.model``);
Triton merges only equal shapes, so those requests batch poorly. Padding them to a few bucket lengths lets
them batch again at the price of computing the padding. Here, on the pick's configuration at its operating
rate (the same arrivals every run), each bucket candidate of ``perf.measure.shapes.bucket_candidates`` (no
buckets, 2 and 4 lengths at quantiles of the traffic's lengths, and the spec's own ``buckets:``) is
measured, with one run at a single length beside them for comparison; a candidate whose padding changes the
model's answer beyond the spec's tolerance (``perf.measure.padding_check``) is neither measured nor chosen,
and the section says why. The choice: the candidate that meets
the budget with the lowest p99 (at an equal offered rate, the served rates are equal), else the one that
served the most. Each run's formed batches per length and each bucketed run's padding cost (raw compute at
the padded over the true lengths) go into the section. These runs use our client whatever the tuner's
engine: its records carry each request's length.

The run of the way the search sent (the spec's ``buckets:``, or each request at its own length) is one
more run of the answer at its rate: where no way meets the budget, the caller counts it as evidence
(``ShapesOutcome.as_searched``), and a miss there reopens the answer (``perf.session.search``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from perf.markdown import number, ratio, table
from perf.measure.engine import OurEngine
from perf.measure.loads import Load
from perf.measure.measurement import Measurement
from perf.measure.padding_check import offered_ways, refused_lines
from perf.measure.shapes import (
    PADDING_BATCH,
    PaddingCost,
    axis_bound,
    bucket_ways,
    has_variable_axis,
    length_of,
    onnx_timer,
    padding_cost,
    shape_mix,
    shape_rows,
    shape_table,
)
from perf.model.batcher import BatcherConfig
from perf.session.model import ModelSession

log = logging.getLogger(__name__)
HEADING = "## Shapes as served: length buckets"


@dataclass(frozen=True)
class BucketRun:
    name: str
    buckets: tuple[int, ...] | None  # None: every request at one length
    measured: Measurement
    padding: PaddingCost | None


def choose(runs: list[BucketRun], budget_ms: float) -> BucketRun:
    """The run that meets the budget with the lowest p99, else the one that served the most; never the
    one-length run (it is not the traffic)."""
    shaped = [run for run in runs if run.buckets is not None]
    meeting = [run for run in shaped if run.measured.meets(budget_ms)]
    if meeting:
        return min(meeting, key=lambda run: run.measured.p99_ms)
    return max(shaped, key=lambda run: run.measured.throughput)


def bucket_runs(
    session: ModelSession, load: Load, step: Callable[[str], None], ways: dict[str, tuple[int, ...]]
) -> list[BucketRun]:
    """One run at a single length, then one per bucket set of ``ways``, all under ``load`` on the
    configuration loaded now; the session is left sending as it did before."""
    mix = shape_mix(session.base, session.seed)
    before = (session.buckets, session.vary_shapes)
    timer = onnx_timer(session.model_file, session.base, PADDING_BATCH, session.seed)
    bound = axis_bound(session.base)
    runs = []
    try:
        session.use_buckets(None, vary_shapes=False)
        length = length_of(session.base, list(session.target.inputs.values()))
        step(f"shapes: every request at one length ({length})")
        measured = session.measure(load, "one length", engine=OurEngine())
        runs.append(BucketRun(f"one length ({length})", None, measured, None))
        for name, buckets in ways.items():
            step(f"shapes: {name}")
            session.use_buckets(buckets)
            measured = session.measure(load, f"shapes: {name}", engine=OurEngine())
            cost = padding_cost(mix, buckets, bound, timer) if buckets else None
            runs.append(BucketRun(name, buckets, measured, cost))
    finally:
        session.use_buckets(before[0], before[1])
    return runs


@dataclass(frozen=True)
class ShapesOutcome:
    """The section's lines, the buckets chosen (``[]``: none; None where no way met the budget: the
    spec's stay) and the run of the way the search sent (None for a fixed-shape model, or where that
    way's padding changes the answer: refused, not measured)."""

    lines: list[str]
    buckets: list[int] | None
    as_searched: Measurement | None


def shapes_outcome(
    session: ModelSession, config: BatcherConfig, load: Load, budget_ms: float,
    step: Callable[[str], None] | None = None, written: str = "spec.tuned.yaml",
) -> ShapesOutcome:  # fmt: skip
    """The bucket runs on ``config`` under ``load`` as a report section, the buckets chosen (``[]``:
    none) where the choice meets the budget, None where nothing does (the spec's ``buckets:`` stay) or
    the shapes are fixed, and the run of the way the search sent. ``written``: the merged spec that
    carries the choice (tune's or plan's)."""
    if not has_variable_axis(session.base):
        return ShapesOutcome([], None, None)
    searched = session.buckets if session.buckets is not None else tuple(session.base.buckets)
    session.prepare(config)
    mix = shape_mix(session.base, session.seed)
    ways, refused = offered_ways(
        bucket_ways(session.base, session.seed), session.model_file, session.base, mix, session.seed
    )
    runs = bucket_runs(session, load, step or (lambda text: None), ways)
    as_searched = next((run.measured for run in runs if run.buckets == searched), None)
    chosen = choose(runs, budget_ms)
    max_batch = session.current.max_batch_size if session.current else session.largest_batch
    header = ["sent", "buckets", "inf/s", "p99 ms", "mean batch (Triton)", "padding: compute ×",
              "padded share", f"meets {budget_ms:g} ms"]  # fmt: skip
    rows = [
        [run.name + (" (chosen)" if run is chosen else ""),
         "–" if not run.buckets else str(list(run.buckets)), number(run.measured.throughput, 0),
         number(run.measured.p99_ms), number(run.measured.stats.mean_batch, 2),
         ratio(run.padding.ratio) if run.padding else "–",
         f"{run.padding.padded_share:.0%}" if run.padding else "–",
         "yes" if run.measured.meets(budget_ms) else "no"]
        for run in runs
    ]  # fmt: skip
    meets = chosen.measured.meets(budget_ms)
    if not meets:
        advice = "no way of sending meets the budget here; the spec's `buckets:` stay as they are"
    elif chosen.buckets:
        advice = (
            f"`{written}` carries `buckets: {list(chosen.buckets)}` (perf, tune and plan pad to them; "
            "the client pads, the model computes the padding)"
        )
    else:
        advice = f"each request at its own length: `{written}` carries `buckets: []`"

    config = session.current.label if session.current else "?"
    lines = [
        f"{HEADING}: {config}, {load.name}",
        "",
        f"Request lengths: {mix.describe()}. The runs above measured "
        "them as they come (Triton batches only equal shapes); here the same arrivals are sent at one "
        "length, at each length, and padded to bucket candidates. Choice: the lowest p99 that meets the "
        f"budget, else the most served: **{chosen.name}**: {advice}. Measured with our client (its records "
        "carry each request's length).",
        "",
        table(header, rows),
        "",
        f"Padding cost: raw compute (onnxruntime, batch {PADDING_BATCH}), padded over true lengths.",
        *("\n" + line for line in refused_lines(refused)),
    ]
    for run in runs:
        measured = run.measured
        records = measured.measured_records()
        if run.buckets is None:  # one shape: Triton's own count says it all
            continue
        lines += ["", f"### {run.name}: formed batches per length sent", ""]
        lines += shape_table(shape_rows(records, max_batch, measured.stats.executions))
    return ShapesOutcome(lines, list(chosen.buckets or ()) if meets else None, as_searched)
