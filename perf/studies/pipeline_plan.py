"""What the pipeline study compares: pure data, so profiles can name comparisons without torch.
``VARIANTS`` are study-only pipelines built beside the spec's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Comparison:
    """A pipeline measured against ``model``; ``boundaries`` = stages − 1."""

    pipeline: str
    model: str
    boundaries: int
    role: str  # what the row shows: "pipeline …", "fp16 boundary", "replicas [1, 2]", ...
    goals: tuple[str, ...] = ()  # keys of ``perf.studies.goals.GOALS`` this row is judged by


VARIANTS: tuple[dict[str, Any], ...] = (
    {"name": "recommender_pipeline_fp16b", "model": "recommender", "split": "embedding_dense",
     "boundary_dtype": "fp16"},
    {"name": "image_classifier_pipeline_r12", "model": "image_classifier", "split": "blocks", "stages": 2,
     "replicas": [1, 2]},
    {"name": "image_classifier_torch", "model": "image_classifier", "split": "blocks", "stages": 1},
)  # fmt: skip

COMPARISONS: dict[str, Comparison] = {
    c.pipeline: c
    for c in (
        Comparison("recommender_pipeline", "recommender", 1, "pipeline (embedding | dense)",
                   ("pipeline saturation", "added p50 per boundary")),
        Comparison("recommender_pipeline_fp16b", "recommender", 1, "fp16 boundary"),
        Comparison("image_classifier_pipeline", "image_classifier", 1, "pipeline (2 stages, auto split)",
                   ("pipeline saturation",)),
        Comparison("image_classifier_pipeline_fp16", "image_classifier", 1, "fp16 boundary"),
        Comparison("image_classifier_pipeline_r12", "image_classifier", 1, "replicas [1, 2]"),
        Comparison("image_classifier_torch", "image_classifier", 0, "1 stage, same torch runner"),
    )
}  # fmt: skip
LIVE_PIPELINE = "recommender_pipeline"  # the one whose parameters the live phase updates while serving
