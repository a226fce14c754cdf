"""What the planner chooses between (``Strategy``: data, pipeline, hybrid or sharded parallel, with its
precision a parameter like any other) and what it knows of the model it plans for (``ModelProfile``)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Literal

from exporters.schema.models import ModelSpec, PipelineSpec, Spec
from perf.model.batcher import BatcherConfig, ServiceModel
from perf.model.cpu import CpuModel
from perf.plan.graph_memory import Table

# precision -> the dtype of the float inputs and outputs of the model exported in it (int8 graphs take
# and give fp32: the quantization is inside)
TENSOR_DTYPE = {"fp32": "fp32", "fp16": "fp16", "int8": "fp32"}
# precisions a plan considers only where the spec already serves the model in them (a quantized
# variant is the user's choice: its calibration data and tolerance are in that entry)
OPT_IN_PRECISIONS = ("int8",)
PRECISIONS = tuple(TENSOR_DTYPE)
BOUNDARY_DTYPES = ("fp32", "fp16")  # a split's boundary compression (``pipelines[].boundary_dtype``)
Kind = Literal["data", "pipeline", "hybrid", "sharded"]
WHOLE_KINDS = ("data", "sharded")  # the whole model's graph, one batcher in front of every instance


def precision_variant(model: ModelSpec, precision: str) -> ModelSpec:
    """``model`` in ``precision`` (float tensors in ``TENSOR_DTYPE[precision]``), ``<name>_<precision>``."""
    if precision == model.precision:
        return model
    floats, dtype = set(TENSOR_DTYPE.values()), TENSOR_DTYPE[precision]

    def retyped(tensors):
        return tuple(replace(t, dtype=dtype) if t.dtype in floats else t for t in tensors)

    return replace(
        model, name=f"{model.name}_{precision}", precision=precision,
        inputs=retyped(model.inputs), outputs=retyped(model.outputs),
    )  # fmt: skip


def whole_variants(spec: Spec, base: ModelSpec) -> dict[str, ModelSpec]:
    """``base`` in every precision; an opt-in one (int8) only where the spec serves the model in it."""
    whole = {}
    same = (base.source, base.options, base.seed)
    for precision in PRECISIONS:
        variant = precision_variant(base, precision)
        if precision in OPT_IN_PRECISIONS:
            served = [
                m for m in spec.models if (m.source, m.options, m.seed, m.precision) == (*same, precision)
            ]
            if not served:
                continue
            if precision != base.precision:
                variant = replace(variant, calibration=served[0].calibration)
        whole[precision] = variant
    return whole


def split_variants(spec: Spec, model: str) -> dict[str, PipelineSpec]:
    """The spec's first pipeline splitting ``model`` in each boundary dtype, none without one (no live
    updates: a plan may give the first stage several instances)."""
    if not (pipelines := [p for p in spec.pipelines if p.model == model]):
        return {}
    first = replace(pipelines[0], live_updates=False, replicas=())
    return {d: replace(first, boundary_dtype=d, name=f"{first.name}_{d}") for d in BOUNDARY_DTYPES}


@dataclass(frozen=True)
class StageCost:
    """One stage (or the whole model): ``T + (N-1)·Δt`` a batch, an instance's memory, bytes a sample out."""

    name: str
    t_s: float
    dt_s: float
    memory_bytes: int
    out_bytes_per_sample: float = 0.0


@dataclass(frozen=True)
class Overheads:
    """Costs beyond compute (the tuner's probe on a CPU server; none on a GPU plan)."""

    per_batch_s: float = 0.0
    per_request_s: dict[int, float] = field(default_factory=dict)  # per instance count
    overhead_s: float = 0.0
    cpu: dict[int, CpuModel] = field(default_factory=dict)  # per instance count

    def service(self, cost: StageCost, instances: int, stages: int = 1) -> ServiceModel:
        """The stage's service model with these costs; a stage of ``stages`` shares the CPU with the others,
        so its CPU term counts every stage's requests and executions."""
        cpu = self.cpu.get(instances) or self.cpu.get(min(self.cpu, default=0))
        if cpu is not None and stages > 1:
            per_request_s, per_execution_s = stages * cpu.per_request_s, stages * cpu.per_execution_s
            cpu = replace(cpu, per_request_s=per_request_s, per_execution_s=per_execution_s)
        per_request = self.per_request_s.get(instances, max(self.per_request_s.values(), default=0.0))
        return ServiceModel(cost.t_s, cost.dt_s, per_request, self.overhead_s, self.per_batch_s, cpu)


@dataclass(frozen=True)
class ModelProfile:
    """What the planner knows of one model on the device it plans for: costs, memory, accuracy per variant."""

    model: str
    max_batch: int
    whole: dict[str, StageCost]  # precision -> the whole model
    stages: dict[str, tuple[StageCost, ...]]  # precision -> the split's stages (empty: no split)
    accuracy: dict[str, float]  # "whole/fp16", "split/fp32", ... -> max relative error vs fp32 torch
    overheads: Overheads = field(default_factory=Overheads)
    compute_source: str = ""  # where the compute figures were measured, for the report
    split_name: str = ""  # the pipeline of the spec the split strategies serve
    tables: tuple[Table, ...] = ()  # the embedding tables, where they dominate the parameters
    memory_source: str = ""  # how memory per instance was found, for the report

    def precisions(self, kind: Kind) -> tuple[str, ...]:
        if kind in WHOLE_KINDS:
            return tuple(p for p in PRECISIONS if self.whole.get(p))
        return tuple(p for p in BOUNDARY_DTYPES if self.stages.get(p))

    def costs(self, strategy: Strategy) -> tuple[StageCost, ...]:
        """Per stage; for ``sharded``, the dense part (its memory without the tables, packed separately)."""
        if strategy.kind == "data":
            return (self.whole[strategy.precision],)
        if strategy.kind == "sharded":
            whole = self.whole[strategy.precision]
            tables = sum(t.bytes(strategy.precision) for t in self.tables)
            return (replace(whole, memory_bytes=max(0, whole.memory_bytes - tables)),)
        return self.stages[strategy.precision]

    def split_of(self, strategy: Strategy) -> tuple[str, tuple[str, ...]]:
        """The split's served pipeline name and its stages' name suffixes."""
        if strategy.kind in WHOLE_KINDS:
            return ("", ())
        built = f"{self.split_name}_{strategy.precision}"
        return self.split_name, tuple(c.name.removeprefix(built) for c in self.stages[strategy.precision])

    def error_of(self, strategy: Strategy) -> float:
        form = "whole" if strategy.kind in WHOLE_KINDS else "split"
        return self.accuracy.get(f"{form}/{strategy.precision}", 0.0)


@dataclass(frozen=True)
class Strategy:
    """One architecture; pipeline and hybrid replicas are each their own chain of stage models (stage ``k``
    with ``instances[k]``); data and sharded put ``instances[0]`` on each of ``replicas`` devices."""

    kind: Kind
    precision: str
    instances: tuple[int, ...]
    replicas: int = 1
    delay_us: int = 0
    max_batch: int = 32

    @property
    def stages(self) -> int:
        return len(self.instances)

    @property
    def devices(self) -> int:
        """Devices it occupies (one stage per device on a GPU plan)."""
        return self.replicas if self.kind in WHOLE_KINDS else self.replicas * self.stages

    def batcher(self, stage: int = 0) -> BatcherConfig:
        """Stage ``stage``'s batcher: the delay on the first stage, a short re-forming wait after it."""
        from exporters.pipelines.configs import DOWNSTREAM_QUEUE_DELAY_US

        delay = self.delay_us if stage == 0 else min(self.delay_us, DOWNSTREAM_QUEUE_DELAY_US)
        count = self.instances[stage] * (self.replicas if self.kind in WHOLE_KINDS else 1)
        return BatcherConfig(self.max_batch, delay, instances=count)

    @property
    def label(self) -> str:
        delay = f", delay {self.delay_us / 1000:g} ms"
        if self.kind == "data":
            where = f" on {self.replicas} GPUs" if self.replicas > 1 else ""
            return f"whole model ×{self.instances[0]}{where}, {self.precision}{delay}"
        if self.kind == "sharded":
            return (
                f"tables over {self.replicas} GPUs, dense ×{self.instances[0]} on each, "
                f"{self.precision}{delay}"
            )
        stages = "+".join(str(n) for n in self.instances)
        replicas = f"{self.replicas} replicas of " if self.replicas > 1 else ""
        return f"{replicas}{self.stages} stages ×[{stages}], {self.precision} boundary{delay}"


@dataclass(frozen=True)
class Space:
    """Which strategies to consider: instances per device or stage, delays, device counts."""

    instances: tuple[int, ...] = (1, 2)
    delays_us: tuple[int, ...] = (0, 1000)
    split: bool = True


def _powers_up_to(count: int) -> tuple[int, ...]:
    return (*(n for n in (1, 2, 4, 8, 16) if n < count), count)


def strategies(profile: ModelProfile, gpus: int, space: Space) -> list[Strategy]:
    """Every strategy of ``space`` for ``profile`` on ``gpus`` GPUs (0: the CPU, one device)."""
    whole: dict[Kind, tuple[int, ...]] = {"data": _powers_up_to(gpus) if gpus else (1,)}
    if profile.tables and gpus >= 2:
        whole["sharded"] = _powers_up_to(gpus)[1:]
    out = [
        Strategy(kind, precision, (instances,), count, delay, profile.max_batch)
        for kind, counts in whole.items()
        for precision, count, instances, delay in itertools.product(
            profile.precisions(kind), counts, space.instances, space.delays_us
        )
    ]
    if not space.split:
        return out
    for precision in profile.precisions("pipeline"):
        stages = len(profile.stages[precision])
        most = max(1, gpus // stages) if gpus else 1
        for replicas in _powers_up_to(most) if gpus >= stages or not gpus else ():
            kind: Kind = "pipeline" if replicas == 1 else "hybrid"
            per_stage = itertools.product(space.instances, repeat=stages)
            for instances, delay in itertools.product(per_stage, space.delays_us):
                out.append(Strategy(kind, precision, instances, replicas, delay, profile.max_batch))
    return out
