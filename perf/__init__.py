"""The public pieces of ``make perf`` for other studies (``measure`` is not re-exported: its name would
hide the package ``perf.measure``)."""

from perf.measure.engine import MeasureSettings
from perf.measure.loads import Load, closed_loop, poisson, trace
from perf.measure.measurement import Measurement
from perf.measure.records import Record, Summary, summarize
from perf.measure.target import Caller, Target, target_from_spec

__all__ = [
    "Caller", "Load", "MeasureSettings", "Measurement", "Record", "Summary", "Target", "closed_loop",
    "poisson", "summarize", "target_from_spec", "trace",
]  # fmt: skip
