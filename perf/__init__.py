"""Load generation, measurement and the batching study behind ``make perf``.

The public pieces for other studies: ``Target``, ``target_from_spec`` and ``Caller`` (what to load,
over which protocol), the load shapes ``closed_loop``, ``poisson`` and ``trace``,
``perf.measure.measurement.measure`` (one model at one load → ``Measurement`` with every request's
``Record`` and the server's own view; not re-exported here, where its name would hide the package
``perf.measure``), ``summarize`` (records → figures) and ``perf.studies.report`` (figures → markdown
tables and plots). A whole new study stands on ``perf.studies.framework`` (``StudyContext``,
``Study``) and ``perf.studies.goals.GOALS``.
"""

from perf.measure.engine import MeasureSettings
from perf.measure.loads import Load, closed_loop, poisson, trace
from perf.measure.measurement import Measurement
from perf.measure.records import Record, Summary, summarize
from perf.measure.target import Caller, Target, target_from_spec

__all__ = [
    "Caller", "Load", "MeasureSettings", "Measurement", "Record", "Summary", "Target", "closed_loop",
    "poisson", "summarize", "target_from_spec", "trace",
]  # fmt: skip
