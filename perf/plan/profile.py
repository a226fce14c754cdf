"""What the planner measures of a model before it predicts (``ModelProfile``): the variants built and
timed in-process, memory counted from the graph, on the CPU the costs beyond compute from the tuner's
probe, and for a GPU this host lacks a recorded compute profile (docs/PLAN.md has the method)."""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

import torch

from client.infer import timed_calls
from exporters.memory import measured_instance_memory
from exporters.pipelines.build import BuiltPipeline, build_pipelines, make_stages
from exporters.pipelines.stages import load_stage, stage_examples
from exporters.repository import build_repository
from exporters.schema.models import ModelSpec, Spec
from exporters.sources.inputs import draw_inputs
from exporters.sources.load import build_torch_model
from perf.errors import OptionError
from perf.measure.raw import measure_raw
from perf.model.memory import MIB
from perf.plan.compute_profile import ComputeProfile, PrecisionCompute
from perf.plan.graph_memory import PROXY_ROWS, TABLES, GraphMemory, compute_proxy, count, onnx_instance_bytes
from perf.plan.strategy import ModelProfile, Overheads, StageCost, split_variants, whole_variants
from perf.session.probe import ProbeResult


def plan_target(spec: Spec, name: str) -> tuple[Spec, str]:
    """``MODEL=`` as a model, or a pipeline (the spec comes back with it first: the split is taken from the
    first pipeline); anything else is an error naming both lists."""
    if any(m.name == name for m in spec.models):
        return spec, name
    for pipeline in spec.pipelines:
        if pipeline.name == name:
            others = tuple(p for p in spec.pipelines if p is not pipeline)
            return replace(spec, pipelines=(pipeline, *others)), pipeline.model
    raise OptionError(
        f"no model or pipeline named {name!r} (models: {[m.name for m in spec.models]}; "
        f"pipelines: {[p.name for p in spec.pipelines]})"
    )


def _median_s(fn, tensors: tuple[torch.Tensor, ...], repeats: int = 15) -> float:
    with torch.no_grad():
        return statistics.median(timed_calls(lambda: fn(*tensors), repeats, warmup=3)) / 1e3


def _stage_params(stages, memory: GraphMemory | None) -> list[int]:
    """Each stage's fp32 parameter bytes, its tables at the model's size (``memory``), not its proxy's."""
    real = iter(memory.tables if memory is not None else ())
    params = []
    for stage in stages:
        total = sum(p.numel() * p.element_size() for p in stage.module.parameters())
        for child in stage.module.modules():
            if isinstance(child, TABLES) and (table := next(real, None)) is not None:
                total += table.bytes("fp32") - child.weight.numel() * child.weight.element_size()
        params.append(total)
    return params


def _stage_costs(
    built: BuiltPipeline, base: ModelSpec, repository: Path, total: StageCost, memory: GraphMemory | None
) -> tuple[StageCost, ...]:
    """Per stage: ``total`` shared out by the stage's part of the chain's time at batch 1 (``T``), at max
    batch (``Δt``) and of its parameter bytes (memory), with the bytes per sample over its boundary."""
    model = build_torch_model(base)
    stages, _ = make_stages(built.spec, base, model, built.record.split_plan, built.record.build_id)
    timings = []
    for batch in (1, base.max_batch_size):
        arrays = draw_inputs(base, batch, 0, model)
        inputs = {t.name: torch.from_numpy(a) for t, a in zip(base.inputs, arrays, strict=True)}
        examples = stage_examples(stages, inputs)
        fns = [load_stage(s, repository / s.name / "1" / s.artifact_name) for s in stages]
        timings.append([_median_s(fn, example) for fn, example in zip(fns, examples, strict=True)])
    params = _stage_params(stages, memory)
    one, top = ([t / sum(times) for t in times] for times in timings)
    shares = [p / max(sum(params), 1) for p in params]
    boundary = [b.bytes_per_row for b in built.record.boundaries] + [0]
    return tuple(
        StageCost(name, total.t_s * t, total.dt_s * dt, int(total.memory_bytes * share), sent)
        for name, t, dt, share, sent in zip(built.spec.stage_names, one, top, shares, boundary, strict=True)
    )


def measure_profile(
    spec: Spec, model: str, repository: Path, split: bool = True, probe: ProbeResult | None = None,
    providers: tuple[str, ...] = ("CPUExecutionProvider",), device: str = "this host's CPU",
    recorded: ComputeProfile | None = None, counted: tuple[GraphMemory | None, str] | None = None,
) -> ModelProfile:  # fmt: skip
    """Build the variants into ``repository`` and measure them (``probe``: the costs beyond compute)."""
    memory, proxy_reason = counted or count(spec.model(model))
    if proxy_reason:  # timed on its compute proxy in its place
        proxy = compute_proxy(spec.model(model))
        if proxy is None:
            raise OptionError(f"{proxy_reason}, and it has no smaller proxy to time its compute on")
        spec = replace(spec, models=tuple(proxy if m.name == model else m for m in spec.models))
    whole_specs = whole_variants(spec, spec.model(model))
    split_specs = split_variants(spec, model) if split else {}
    built = {
        m.spec.precision: m for m in build_repository(Spec(models=tuple(whole_specs.values())), repository, 0)
    }
    base = whole_specs["fp32"]
    whole: dict[str, StageCost] = {}
    accuracy: dict[str, float] = {}
    for precision, variant in whole_specs.items():
        artifact, largest = built[precision].artifact, variant.max_batch_size
        pool = dict(zip([t.name for t in variant.inputs], draw_inputs(variant, largest, 0), strict=True))
        one, top = measure_raw(
            artifact.path, pool, [1, largest], variant.threads.intra_op, variant.threads.inter_op,
            seconds=0.3, providers=providers,
        )  # fmt: skip
        # T and Δt through batch 1 and the largest (the slope kept >= 0)
        t_s, top_s = one.batch_ms / 1e3, top.batch_ms / 1e3
        dt_s = max(0.0, (top_s - t_s) / max(largest - 1, 1))
        if memory is not None:
            instance = memory.instance_bytes(precision)
        elif artifact.path.suffix == ".onnx":  # no torch module: its ONNX export counted
            instance = onnx_instance_bytes(artifact.path, largest)
        else:  # ... or another export measured
            instance = measured_instance_memory(variant, artifact.path)
        whole[precision] = StageCost(variant.name, t_s, dt_s, instance)
        accuracy[f"whole/{precision}"] = artifact.max_rel_error
    source = f"onnxruntime in-process on {device}"
    if proxy_reason:
        source += f" on its compute proxy (tables capped at {PROXY_ROWS:,} rows; {proxy_reason})"
    overheads = Overheads()
    if probe is not None:
        fit = probe.fits[min(probe.fits)]
        whole = _rescaled(whole, whole["fp32"], fit.t_ms / 1e3, fit.dt_ms / 1e3)
        per_request = {n: ms / 1e3 for n, ms in probe.per_request_ms.items()}
        cpu = {n: s.cpu for n, s in probe.services.items() if s.cpu is not None}
        overheads = Overheads(probe.per_batch_ms / 1e3, per_request, probe.overhead_ms / 1e3, cpu)
        source = (
            "the server's compute statistics (the tuner's probe of the fp32 whole model); other precisions "
            "and the stages scaled by onnxruntime in-process"
        )
    if recorded is not None:
        whole, source = with_recorded(whole, recorded.of(model, "--compute-profile"), recorded)
    stages: dict[str, tuple[StageCost, ...]] = {}
    split_name = ""
    if split_specs:
        pipelines = tuple(split_specs.values())
        pipeline_spec = Spec(models=(base,), pipelines=pipelines)
        for pipeline in build_pipelines(pipeline_spec, repository, 0):
            precision = pipeline.spec.boundary_dtype
            stages[precision] = _stage_costs(pipeline, base, repository, whole["fp32"], memory)
            accuracy[f"split/{precision}"] = max(
                pipeline.record.artifact_max_rel_error, pipeline.record.compression_max_rel_error
            )
        split_name = pipelines[0].name.removesuffix("_fp32")
    tables = memory.tables if memory is not None and memory.tables_dominate else ()
    return ModelProfile(
        model, base.max_batch_size, whole, stages, accuracy, overheads, source, split_name, tables,
        memory_source(memory),
    )  # fmt: skip


def with_recorded(
    whole: dict[str, StageCost], figures: dict[str, PrecisionCompute], recorded: ComputeProfile
) -> tuple[dict[str, StageCost], str]:
    """``whole`` with the recorded compute (others scaled by its first's ratio), and the source."""
    if not (shared := [p for p in ("fp32", *figures) if p in figures and p in whole]):
        raise OptionError(
            f"--compute-profile: no precision the plan considers ({', '.join(whole)}) is recorded"
        )
    reference = shared[0]
    out = _rescaled(whole, whole[reference], figures[reference].T_ms / 1e3, figures[reference].dt_ms / 1e3)
    for precision, mine in figures.items():
        if precision in whole:
            out[precision] = replace(whole[precision], t_s=mine.T_ms / 1e3, dt_s=mine.dt_ms / 1e3)
    scaled = [p for p in whole if p not in figures]
    source = (
        f"the compute profile recorded on {recorded.device} ({recorded.source}): "
        f"{', '.join(p for p in whole if p in figures)}"
        + (f"; {', '.join(scaled)} scaled from its {reference} by this host's ratio" if scaled else "")
        + "; the stages by their share timed here"
    )
    return out, source


def _rescaled(
    costs: dict[str, StageCost], reference: StageCost, t_s: float, dt_s: float
) -> dict[str, StageCost]:
    """``costs`` with ``T`` and ``Δt`` scaled as ``reference``'s are to ``t_s`` and ``dt_s`` (0: unscaled)."""
    scale_t = t_s / reference.t_s if reference.t_s > 0 else 1.0
    scale_dt = dt_s / reference.dt_s if reference.dt_s > 0 else 1.0
    return {p: replace(c, t_s=c.t_s * scale_t, dt_s=c.dt_s * scale_dt) for p, c in costs.items()}


def memory_source(memory: GraphMemory | None) -> str:
    """How memory per instance was found, for the report."""
    if memory is None:
        return (
            "counted from each precision's exported ONNX file: its initializers and every tensor ONNX "
            "shape inference gives at the largest batch (an axis it leaves unknown counts as 1); plus "
            "the CUDA context and workspaces once per GPU (perf.model.memory.CONTEXT_MIB)"
        )
    params, tables = memory.parameter_bytes("fp32") / MIB, memory.table_bytes("fp32") / MIB
    activations = memory.activation_bytes("fp32") / MIB
    return (
        f"counted from the graph: parameters per precision (fp32 {params:,.1f} MiB, of which tables "
        f"{tables:,.1f} MiB) and every activation of a batch of {memory.batch} ({activations:,.1f} MiB "
        "in fp32, no buffer reuse); plus the CUDA context and workspaces once per GPU "
        "(perf.model.memory.CONTEXT_MIB)"
    )
