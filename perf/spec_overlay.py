"""A candidate as the spec says it: a spec overlay (YAML), the merged spec, and Triton's config JSON.

An overlay is a spec document holding only what the tuner changes (``max_batch_size``, ``batching``
and the CPU instance count), per model name; ``apply_overlay`` merges it over the base document and
``exporters.schema.models.parse_spec`` validates the result, so a tuned configuration goes through exactly the
checks a hand-written one does. The config JSON is what ``load_model(..., config=...)`` takes to
reload a model with another batching configuration on a server in explicit model-control mode.
"""

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
    """``base`` with the candidate's batching and instance count.

    The base's queue policy is dropped unless ``keep_queue``: on Triton 2.51 any
    ``default_queue_policy`` stalls the dynamic batcher ~510 ms every few seconds (README, Known
    limits), which would make every p99 the tuner measures that stall instead of the batching.
    """
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
    return dataclasses.replace(
        base,
        max_batch_size=config.max_batch_size if config.batching else base.max_batch_size,
        batching=batching,
        instances=instances,
    )


def overlay_entry(
    base: ModelSpec, config: BatcherConfig, keep_queue: bool = False, buckets: tuple[int, ...] | None = None
) -> dict[str, Any]:
    """The overlay's entry for one model: only the fields the tuner decides (``batching`` whole, and
    for a variable-length model the length ``buckets`` it chose, ``()`` for none)."""
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
    return entry


def _merge(base: Any, over: Any) -> Any:
    """Mappings merge key by key; anything else in ``over`` replaces ``base``."""
    if isinstance(base, dict) and isinstance(over, dict):
        merged = dict(base)
        for key, value in over.items():
            merged[key] = _merge(base.get(key), value) if key in base else copy.deepcopy(value)
        return merged
    return copy.deepcopy(over)


def apply_overlay(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """Merge an overlay's ``models`` entries over the base document's, by name. A name the base lacks
    is an error (an overlay tunes models, it does not add them). ``batching`` is replaced whole (a
    tuned batcher is one decision: a queue policy the overlay leaves out is gone); other mappings merge."""
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
    """The base spec's document (the bounded reader every spec goes through) with its models' source
    paths made absolute, resolved against the base spec's folder: a spec merged from it and written
    elsewhere (a report folder, where the base's relative paths point nowhere) builds from any folder."""
    return with_absolute_paths(load_spec_document(base_path), base_path.resolve().parent)


def write_merged_spec(
    base_path: Path,
    overlay: dict[str, Any],
    folder: Path,
    name: str,
    note: str,
    merge: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]] = apply_overlay,
) -> Spec:
    """Write ``overlay.yaml`` and the base spec merged with it (``merge``) as ``name`` into ``folder``;
    return the checked spec. The tuner's and the planner's one writer (``spec.tuned.yaml``,
    ``spec.planned.yaml``); the merged spec's source paths are absolute (``base_document``)."""
    merged = merge(base_document(base_path), overlay)
    spec = parse_spec(merged)  # the same validation as models.yaml: a bad overlay fails here, by field
    header = f"# {note}\n"
    anchored = (
        f"# source paths made absolute (the base spec's are relative to {base_path.resolve().parent})\n"
    )
    (folder / "overlay.yaml").write_text(header + yaml.safe_dump(overlay, sort_keys=False))
    (folder / name).write_text(header + anchored + yaml.safe_dump(merged, sort_keys=False))
    return spec


def write_overlay(
    base_path: Path,
    base: ModelSpec,
    config: BatcherConfig,
    folder: Path,
    note: str,
    keep_queue: bool = False,
    buckets: tuple[int, ...] | None = None,
) -> Spec:
    """Write ``overlay.yaml`` and the merged ``spec.tuned.yaml`` into ``folder``; return the checked spec."""
    overlay = {"models": [overlay_entry(base, config, keep_queue, buckets)]}
    return write_merged_spec(base_path, overlay, folder, "spec.tuned.yaml", note)


def config_json(spec: ModelSpec) -> str:
    """The Triton model configuration of ``spec`` on a CPU target, as ``load_model`` overrides take it."""
    return json_format.MessageToJson(build_model_config(spec, num_gpus=0).to_proto())
