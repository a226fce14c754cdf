"""The tuner's session for a pipeline: each candidate reloads every stage with its batching (the first
waits the delay, later stages ``stage_batching``'s short re-forming wait); the server view is the first
stage's."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from google.protobuf import json_format

from exporters.configs.model_config import ModelConfig
from exporters.configs.models import dynamic_batching
from exporters.pipelines.build import BuiltPipeline, build_pipelines
from exporters.pipelines.configs import stage_batching
from exporters.repository import build_repository
from exporters.schema.models import Batching, PipelineSpec, Spec
from perf.measure.engine import LoadEngine, MeasureSettings
from perf.measure.loads import Load
from perf.measure.measurement import Measurement
from perf.measure.noise import NoisePolicy
from perf.model.batcher import BatcherConfig
from perf.session.model import TUNE_WINDOWS, ModelSession
from server import TritonServer


def stage_configs(built: BuiltPipeline, config: BatcherConfig) -> list[ModelConfig]:
    """Every stage's model config with the candidate's batching."""
    pipeline = built.spec
    if config.batching:
        delay, preferred = config.max_queue_delay_us, config.preferred_batch_sizes
        batching = Batching(mode="dynamic", max_queue_delay_us=delay, preferred_batch_sizes=preferred)
        pipeline = dataclasses.replace(pipeline, batching=batching)
    stages = built.configs[1:]  # the ensemble first, then the stages in order
    return [
        dataclasses.replace(
            stage,
            dynamic_batching=dynamic_batching(stage_batching(pipeline, k)) if config.batching else None,
            model_warmup=[],
        )
        for k, stage in enumerate(stages)
    ]


class PipelineSession(ModelSession):
    """``base`` is the model the pipeline splits (its inputs and batch limit)."""

    def __init__(
        self, spec: Spec, pipeline: str, largest_batch: int, workdir: Path, engine: LoadEngine,
        settings: MeasureSettings = TUNE_WINDOWS, noise: NoisePolicy | None = None,
    ) -> None:  # fmt: skip
        self.pipeline: PipelineSpec = spec.pipeline(pipeline)
        super().__init__(spec, self.pipeline.model, largest_batch, workdir, engine, settings, noise)
        # The stages' batch axis is the model's: candidates stay within what the stages were built for.
        self.largest_batch = self.base.max_batch_size
        self.related = tuple(self.pipeline.stage_names)
        self.sent_to = self.pipeline.name
        self.built: BuiltPipeline | None = None

    def __enter__(self) -> PipelineSession:
        repository = self.workdir / "repository"
        # built with the probe's first candidate loaded: one reload of every stage fewer
        first = BatcherConfig(self.largest_batch, 0)
        self.pipeline = dataclasses.replace(
            self.pipeline, batching=Batching(mode="dynamic", max_queue_delay_us=0)
        )
        spec = Spec(models=(dataclasses.replace(self.base, warmup=False),), pipelines=(self.pipeline,))
        build_repository(spec, repository, num_gpus=0)  # the monolithic model: the raw reference
        (self.built,) = build_pipelines(spec, repository, num_gpus=0)
        # the ensemble loads its stages
        self.server = TritonServer(self._options(repository, [self.pipeline.name])).start()
        self.current = first
        return self

    def _overrides(self, config: BatcherConfig) -> tuple[str, dict[str, dict]]:
        assert self.built is not None
        if config.instances != 1:
            raise ValueError("a pipeline's candidates keep the stages' instance counts (instances = 1)")
        overrides = {
            stage.name: json_format.MessageToDict(stage.to_proto())
            for stage in stage_configs(self.built, config)
        }
        return f"{config.label} on the stages of {self.pipeline.name}", overrides

    def _measure_once(
        self, load: Load, label: str, settings: MeasureSettings, engine: LoadEngine | None = None
    ) -> Measurement:
        run = super()._measure_once(load, label, settings, engine)
        if run.server is not None:
            # the first stage's view, where the delay acts: later stages overlap it (pipeline parallel), so
            # summing their compute would count overlapped time as serial; a failure at any stage counts
            stages = [run.server.related[name] for name in self.related]
            stats = dataclasses.replace(stages[0], failed=max(s.failed for s in stages))
            run.server = dataclasses.replace(run.server, stats=stats)
        return run
