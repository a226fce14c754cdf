"""A candidate as the spec says it: an overlay holding only what the tuner decides, merged over the base
spec and checked by ``parse_spec`` like a hand-written one; and the config JSON ``load_model`` takes to
reload a model with another batching on a server in explicit model-control mode."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from google.protobuf import json_format

from exporters.configs.models import build_model_config
from exporters.schema.bounded_yaml import load_spec_document
from exporters.schema.models import Batching, ModelSpec, Spec, parse_spec, with_absolute_paths
from perf.errors import OptionError
from perf.model.batcher import BatcherConfig


def candidate_spec(base: ModelSpec, config: BatcherConfig, keep_queue: bool = False) -> ModelSpec:
    """``base`` with the candidate's batching and instances; its queue policy dropped unless ``keep_queue``
    (on Triton 2.51 one stalls the batcher ~510 ms every few seconds: every p99 would be that stall)."""
    if config.batching:
        batching = dataclasses.replace(
            base.batching,
            mode="dynamic",
            max_queue_delay_us=config.max_queue_delay_us,
            preferred_batch_sizes=config.preferred_batch_sizes,
            batch_size=0,
            queue=base.batching.queue if keep_queue else None,
        )
    else:
        batching = Batching(mode="none")
    instances = dataclasses.replace(base.instances, cpu=config.instances)
    max_batch_size = config.max_batch_size if config.batching else base.max_batch_size
    return dataclasses.replace(base, max_batch_size=max_batch_size, batching=batching, instances=instances)


def write_overlay(
    base_path: Path, base: ModelSpec, config: BatcherConfig, folder: Path, note: str,
    keep_queue: bool = False, buckets: tuple[int, ...] | None = None,
) -> Spec:  # fmt: skip
    """``overlay.yaml`` (the model's ``batching`` whole, a variable-length model's ``buckets``) and the merged
    ``spec.tuned.yaml`` in ``folder``; the checked spec."""
    tuned = candidate_spec(base, config, keep_queue)
    batching: dict[str, Any] = {"mode": tuned.batching.mode}
    if config.batching:
        batching.update(
            max_queue_delay_us=config.max_queue_delay_us,
            preferred_batch_sizes=list(config.preferred_batch_sizes),
        )
        if tuned.batching.queue is not None:
            batching["queue"] = dataclasses.asdict(tuned.batching.queue)
    entry = {
        "name": base.name,
        "max_batch_size": tuned.max_batch_size,
        "batching": batching,
        "instances": {"cpu": config.instances},
    }
    if buckets is not None:
        entry["buckets"] = list(buckets)
    return write_merged_spec(base_path, {"models": [entry]}, folder, "spec.tuned.yaml", note)


def _merge(base: Any, over: Any) -> Any:
    """Mappings merge key by key; anything else in ``over`` replaces ``base``."""
    if isinstance(base, dict) and isinstance(over, dict):
        return {**base, **{key: _merge(base.get(key), value) for key, value in over.items()}}
    return copy.deepcopy(over)


def apply_overlay(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """Merge an overlay's ``models`` over the base document's by name (an overlay tunes models, it does not
    add them); ``batching`` is replaced whole, a tuned batcher being one decision."""
    merged = copy.deepcopy(base)
    by_name = {entry.get("name"): entry for entry in merged.get("models", [])}
    for index, entry in enumerate(overlay.get("models", [])):
        name = entry.get("name")
        if name not in by_name:
            raise OptionError(f"overlay models[{index}].name: {name!r} is not a model of the base spec")
        target = by_name[name]
        if "batching" in entry:
            target.pop("batching", None)
        target.update(_merge(target, entry))
    return merged


def base_document(base_path: Path) -> dict[str, Any]:
    """The base spec with absolute source paths, so a spec merged from it builds from any folder."""
    return with_absolute_paths(load_spec_document(base_path), base_path.resolve().parent)


def write_merged_spec(
    base_path: Path, overlay: dict[str, Any], folder: Path, name: str, note: str,
    merge: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]] = apply_overlay,
) -> Spec:  # fmt: skip
    """``overlay.yaml`` and the base spec merged with it as ``name`` in ``folder``; the checked spec."""
    merged = merge(base_document(base_path), overlay)
    spec = parse_spec(merged)  # the same validation as models.yaml: a bad overlay fails here, by field
    header = f"# {note}\n"
    anchored = (
        f"# source paths made absolute (the base spec's are relative to {base_path.resolve().parent})\n"
    )
    (folder / "overlay.yaml").write_text(header + yaml.safe_dump(overlay, sort_keys=False))
    (folder / name).write_text(header + anchored + yaml.safe_dump(merged, sort_keys=False))
    return spec


def config_json(spec: ModelSpec) -> str:
    """The Triton model configuration of ``spec`` on a CPU target, as ``load_model`` overrides take it."""
    return json_format.MessageToJson(build_model_config(spec, num_gpus=0).to_proto())
