"""The goals of every study: one ``GoalSpec`` per threshold renders both the target text and the
verdict, so the number in the report's target column is the number that was checked."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from perf.markdown import table

VERDICTS = {True: "met", False: "MISSED", None: "n/a"}


@dataclass(frozen=True)
class Goal:
    """One goal's outcome in one run: what was measured against which target, and the verdict."""

    name: str
    target: str
    measured: str
    met: bool | None  # None: not measured in this run
    limits: str = ""
    model: str = ""  # the model it judged, where a study judges each of several ("": the whole run)

    @property
    def verdict(self) -> str:
        return VERDICTS[self.met]


def all_met(verdicts: Iterable[bool | None]) -> bool | None:
    """One goal's verdict over several parts (modes, checks): missed where a measured part missed, else
    not measured (None) where a part was not, else met; ``and`` would crash on None or read it as missed."""
    verdicts = list(verdicts)
    return False if False in verdicts else None if None in verdicts else True


@dataclass(frozen=True)
class GoalSpec:
    """A threshold: ``text`` has ``{limit}`` where it goes (and ``{fields}`` a study fills in)."""

    name: str
    text: str
    limit: float
    higher_is_better: bool = True

    def target(self, **fields: object) -> str:
        return self.text.format(limit=f"{self.limit:g}", **fields)

    def met(self, value: float) -> bool | None:
        """None for a value that was not measured (NaN)."""
        if math.isnan(value):
            return None
        return value >= self.limit if self.higher_is_better else value <= self.limit

    def outcome(
        self, measured: str = "not measured", met: bool | None = None, limits: str = "", **fields: object
    ) -> Goal:
        """This goal's outcome in a run (by default: not measured), its target filled in with ``fields``."""
        return Goal(self.name, self.target(**fields), measured, met, limits)

    def share(self, value: float) -> float:
        """``value`` as a fraction of the threshold (how close a miss came)."""
        return value / self.limit if self.limit else math.nan


GOALS: dict[str, GoalSpec] = {
    g.name: g
    for g in (
        # the batching study
        GoalSpec("dynamic QPS", "throughput ≥ {limit}× none", 4.0),
        GoalSpec("dynamic p99", "p99 ≤ {limit}× none's", 1.0, higher_is_better=False),
        GoalSpec("served vs raw", "served / raw onnxruntime at the same batch size ≥ {limit}×", 0.9),
        GoalSpec("latency-model fit", "R² ≥ {limit}", 0.97),
        GoalSpec("predicted gain", "within {limit}% of the measured gain", 15.0, higher_is_better=False),
        GoalSpec("Poisson p99 bound",
                 "p99 ≤ max_queue_delay + compute at the largest formed batch + {limit} ms",
                 2.0, higher_is_better=False),
        # the pipeline study
        GoalSpec("pipeline saturation", "throughput at saturation ≥ {limit}× {model}", 0.9),
        GoalSpec("added p50 per boundary", "p50 added per stage boundary ≤ {limit} ms", 0.5,
                 higher_is_better=False),
        GoalSpec("failed during live updates", "failed requests ≤ {limit} during embedding row updates and a "
                 "dense version swap", 0.0, higher_is_better=False),
        # the text-embedding study
        GoalSpec("text served vs raw", "served / raw onnxruntime at the same batches ≥ {limit}×", 0.8),
        GoalSpec("text dynamic vs none", "dynamic (buckets) ≥ {limit}× no batching on short queries", 1.5),
        GoalSpec("text int8 vs fp32", "int8 encoder ≥ {limit}× fp32's throughput at the same batch", 1.8),
        # the queue-policy study
        GoalSpec("queue policy with spare instances",
                 "requests over {stall} ms added by max_queue_size with {instances} instances ≤ {limit}", 0.0,
                 higher_is_better=False),
        GoalSpec("text short-query p99 shared", "short-query p99 with long passages sharing ≤ {limit}× alone",
                 1.5, higher_is_better=False),
        # the tuner (make tune)
        GoalSpec("tuner p99 prediction",
                 "predicted p99 at the operating point within {limit}% of the measured", 20.0,
                 higher_is_better=False),
    )
}  # fmt: skip


def goals_table(goals: Sequence[Goal]) -> str:
    """The goals table every study's report shows (a model column where goals judge models)."""
    per_model = any(g.model for g in goals)
    return table(
        ["model"] * per_model + ["goal", "target", "measured", "verdict", "what limits it"],
        [[g.model] * per_model + [g.name, g.target, g.measured, f"**{g.verdict}**", g.limits] for g in goals],
    )
