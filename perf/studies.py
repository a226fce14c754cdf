"""The studies ``make perf`` runs after the batching study, in order.

Apart from ``perf.framework`` so that the framework knows no study: each study imports the framework,
this list imports the studies.
"""

from __future__ import annotations

from perf.framework import Study


def studies() -> list[Study]:
    """The studies after the batching study (imported here, when asked for: they pull in torch)."""
    from perf.pipeline_study import PipelineStudy
    from perf.queue_policy_study import QueuePolicyStudy
    from perf.shape_study import ShapeStudy
    from perf.text_study import TextStudy

    return [PipelineStudy(), TextStudy(), QueuePolicyStudy(), ShapeStudy()]
