"""The chosen strategy as a spec overlay (merged and checked by ``parse_spec`` like a hand-written spec),
and the ``--model-load-gpu-limit`` flags that make Triton refuse a load past the headroom the placement
kept, instead of running out of memory later under load."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from exporters.schema.models import Spec
from perf.model.memory import HEADROOM
from perf.plan.placement import Placement, replica_name
from perf.plan.strategy import Strategy, precision_variant
from perf.spec_overlay import apply_overlay, write_merged_spec


def _tensors(tensors) -> list[dict[str, Any]]:
    """Each tensor as the spec writes it (``max_shape`` and ``range`` only where set)."""
    return [
        {"name": t.name, "dtype": t.dtype, "shape": list(t.shape)}
        | {key: list(value) for key in ("max_shape", "range") if (value := getattr(t, key)) is not None}
        for t in tensors
    ]


def plan_overlay(
    document: dict[str, Any], spec: Spec, model: str, strategy: Strategy, placement: Placement, on_gpu: bool,
    buckets: Sequence[int] | None = None,
) -> dict:  # fmt: skip
    """The overlay of ``strategy`` placed as ``placement`` over the spec ``document``: another precision is
    another model, ``<model>_<precision>`` (a copy of the model's entry unless the spec has one); a split is
    one pipeline per replica, each stage pinned to its GPU. ``buckets``: the shapes step's (None: spec's)."""
    batching = {"mode": "dynamic", "max_queue_delay_us": strategy.delay_us}
    base = spec.model(model)
    if strategy.kind == "data":
        (assignment,) = placement.assignments
        count = assignment.instances
        instances = {"per_gpu": count, "gpus": list(assignment.gpus)} if on_gpu else {"cpu": count}
        entry: dict[str, Any] = {
            "name": model, "max_batch_size": strategy.max_batch, "batching": batching, "instances": instances,
        }  # fmt: skip
        if strategy.precision != base.precision:
            variant = precision_variant(base, strategy.precision)
            known = {m.get("name"): m for m in document.get("models", [])}
            copy = {} if variant.name in known else dict(known[model])
            copy.pop("batching", None)
            entry = {**copy, **entry, "name": variant.name, "precision": strategy.precision}
            entry.update(inputs=_tensors(variant.inputs), outputs=_tensors(variant.outputs))
        if buckets is not None:
            entry["buckets"] = list(buckets)
        return {"models": [entry]}
    pipeline = next(p for p in spec.pipelines if p.model == model)
    entries = []
    for replica in range(strategy.replicas):
        stages = sorted((a for a in placement.assignments if a.replica == replica), key=lambda a: a.stage)
        entry = {
            "name": replica_name(pipeline.name, replica, strategy.replicas),
            "model": model,
            "split": pipeline.split,
            "stages": pipeline.stages,
            "replicas": list(strategy.instances),
            "boundary_dtype": strategy.precision,
            "batching": batching,
        }
        if pipeline.split == "blocks":
            entry["balance"] = pipeline.balance
            if pipeline.cut_points:
                entry["cut_points"] = list(pipeline.cut_points)
        if on_gpu:
            entry["gpus"] = [a.gpus[0] for a in stages]
        entries.append(entry)
    return {"pipelines": entries}


def merge(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """The base document with the overlay's models merged or joined, its pipelines replacing namesakes."""
    known = {m.get("name") for m in base.get("models", [])}
    models = overlay.get("models", [])
    merged = apply_overlay(base, {"models": [m for m in models if m["name"] in known]})
    merged["models"] = merged["models"] + [m for m in models if m["name"] not in known]
    planned = overlay.get("pipelines", [])
    names = {p["name"] for p in planned}
    merged["pipelines"] = [p for p in merged.get("pipelines", []) if p.get("name") not in names] + planned
    return merged


def write_plan_overlay(base_path: Path, overlay: dict[str, Any], folder: Path, note: str) -> Spec:
    """``overlay.yaml`` and ``spec.planned.yaml`` (absolute source paths) in ``folder``; the checked spec."""
    return write_merged_spec(base_path, overlay, folder, "spec.planned.yaml", note, merge)


def server_flags(placement: Placement) -> list[str]:
    """``--model-load-gpu-limit`` for each GPU the plan uses."""
    gpus = sorted({g for a in placement.assignments for g in a.gpus})
    return [f"--model-load-gpu-limit={g}:{HEADROOM:.2f}" for g in gpus]
