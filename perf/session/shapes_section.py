"""The choice of length buckets as a report section, on ``make tune``'s pick and ``make plan``'s verified
pick at its rate (docs/TUNE.md, "Variable-length models"). Where no way of sending meets the budget, the
run sent as the search sent is one more run of the answer's point, so a miss there reopens the answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from perf.markdown import number, table
from perf.measure.bucket_runs import choose, refused_lines, ways_of
from perf.measure.engine import OurEngine
from perf.measure.loads import Load
from perf.measure.measurement import Measurement, too_few_note
from perf.measure.shapes import PADDING_BATCH
from perf.measure.target import Target
from perf.model.batcher import BatcherConfig
from perf.session.model import ModelSession
from perf.session.search import Evidence, K, decide

HEADING = "## Shapes as served: length buckets"


@dataclass(frozen=True)
class ShapesFigures:
    """The section's lines and the buckets chosen (``()``: none; None: the choice missed the budget)."""

    section: tuple[str, ...]
    buckets: tuple[int, ...] | None


def shapes_step(
    session: ModelSession, config: BatcherConfig, load_at: Callable[[float], Load], rate: float,
    evidence: Evidence[K], answer: K, name: str, step: Callable[[str], None],
    written: str = "spec.tuned.yaml",
) -> ShapesFigures:  # fmt: skip
    """The bucket runs on ``answer`` (served as ``config``) at ``rate``; ``written``: the spec carrying it."""
    budget_ms = evidence.budget_ms
    searched = session.buckets if session.buckets is not None else tuple(session.base.buckets)
    session.prepare(config)
    ways = ways_of(session.base, session.model_file, session.seed)
    load, before = load_at(rate), (session.buckets, session.vary_shapes)

    def send(buckets: tuple[int, ...] | None) -> Target:
        session.use_buckets(buckets, vary_shapes=buckets is not None)
        return session.target

    def measure(target: Target, name: str, length: int) -> Measurement:
        step(f"shapes: every request at one length ({length})" if length else f"shapes: {name}")
        return session.measure(load, name if length else f"shapes: {name}", engine=OurEngine())

    try:  # every way under ``load``, priced; the session is left sending as before
        runs = ways.priced(ways.measure(send, measure))
    finally:
        session.use_buckets(*before)
    as_searched = next((run.measured for run in runs if run.buckets == searched), None)
    chosen = choose(runs, budget_ms)
    header = ["sent", "buckets", "inf/s", "p99 ms", "mean batch (Triton)", "padding: compute ×",
              "padded share", f"meets {budget_ms:g} ms"]  # fmt: skip
    rows = [
        [(run.name if run.buckets is not None else f"{run.name} ({run.length})")
         + (" (chosen)" if run is chosen else ""),
         "–" if not run.buckets else str(list(run.buckets)), number(run.measured.throughput, 0),
         number(run.measured.p99_ms), number(run.measured.stats.mean_batch, 2), *run.padding_cells(),
         "yes" if run.measured.meets(budget_ms)
         else "no" + too_few_note(run.measured.samples, run.measured.too_few)]
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

    lines = [
        f"{HEADING}: {config.label}, {load.name}",
        "",
        f"Request lengths: {ways.mix.describe()}. The runs above measured "
        "them as they come (Triton batches only equal shapes); here the same arrivals are sent at one "
        "length, at each length, and padded to bucket candidates. Choice: the lowest p99 that meets the "
        f"budget, else the most served: **{chosen.name}**: {advice}. Measured with our client (its records "
        "carry each request's length).",
        "",
        table(header, rows),
        "",
        f"Padding cost: raw compute (onnxruntime, batch {PADDING_BATCH}), padded over true lengths.",
        *("\n" + line for line in refused_lines(ways.refused)),
    ]
    for run in runs:
        if run.buckets is not None:  # one shape: Triton's own count says it all
            lines += ["", *run.formed_lines(config.max_batch_size)]
    if not meets and as_searched is not None:  # one more run of the answer's point
        evidence.add(answer, rate, as_searched)
        session.prepare(config)
        decide(session, evidence, answer, rate, load_at, f"re-measure {name}")
    return ShapesFigures(tuple(lines), tuple(chosen.buckets or ()) if meets else None)
