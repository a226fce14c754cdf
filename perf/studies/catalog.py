"""The studies ``make perf`` runs, in order; apart from ``framework`` so that it knows no study."""

from __future__ import annotations

from perf.studies.framework import Study


def studies() -> list[Study]:
    """Every study of ``make perf``, in order (imported here, when asked for: they pull in torch)."""
    from perf.studies.pipeline_study import PipelineStudy
    from perf.studies.queue_policy_study import QueuePolicyStudy
    from perf.studies.report import BatchingStudy
    from perf.studies.shape_study import ShapeStudy
    from perf.studies.text_study import TextStudy

    return [BatchingStudy(), PipelineStudy(), TextStudy(), QueuePolicyStudy(), ShapeStudy()]
