"""The studies ``make perf`` runs after the batching study, in order.

Apart from ``perf.studies.framework`` so that the framework knows no study: each study imports the framework,
this list imports the studies.
"""

from __future__ import annotations

from perf.studies.framework import Study


def studies() -> list[Study]:
    """The studies after the batching study (imported here, when asked for: they pull in torch)."""
    from perf.studies.pipeline_study import PipelineStudy
    from perf.studies.queue_policy_study import QueuePolicyStudy
    from perf.studies.shape_study import ShapeStudy
    from perf.studies.text_study import TextStudy

    return [PipelineStudy(), TextStudy(), QueuePolicyStudy(), ShapeStudy()]
