"""Helpers for the serving-resilience fault tests: a small repository, steady mixed load, leak checks.

The load itself (``MixedLoad``) lives in ``soak.mixed_load``, shared with ``make soak``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import tritonclient.http as httpclient

from exporters.pipeline_build import build_pipelines
from exporters.repository import build_repository
from exporters.spec import parse_spec
from server.stubs import Stub, server_stubs
from soak.mixed_load import PIPELINE, MixedLoad, Outcome, infer_once, request_arrays

__all__ = ["PIPELINE", "MixedLoad", "Outcome", "infer_once", "request_arrays"]

EMBEDDING = f"{PIPELINE}_embedding"


def build_small_repository(spec_data: dict[str, Any], path: Path, pipeline: bool = True) -> Path:
    """``trivial`` (+ ``recommender_pipeline`` and the ``recommender`` it splits) from ``models.yaml``."""
    data = copy.deepcopy(spec_data)
    keep = ("trivial", "recommender") if pipeline else ("trivial",)
    data["models"] = [m for m in data["models"] if m["name"] in keep]
    data["pipelines"] = [p for p in data.get("pipelines", []) if pipeline and p["name"] == PIPELINE]
    spec = parse_spec(data)
    build_repository(spec, path, num_gpus=0)
    if pipeline:
        build_pipelines(spec, path, num_gpus=0)
    return path


def server_success_count(http_url: str, model: str) -> int:
    """Successful inferences of ``model`` (all versions) as the server counts them."""
    stats = httpclient.InferenceServerClient(http_url).get_inference_statistics(model)
    return sum(int(s["inference_stats"]["success"]["count"]) for s in stats["model_stats"])


def shm_regions(prefix: str) -> list[str]:
    return sorted(p.name for p in Path("/dev/shm").glob(f"{prefix}*"))


def stub_of(server_pid: int, model: str) -> Stub:
    """``model``'s live stub in one server."""
    for stub in server_stubs(server_pid):
        if stub.alive and stub.model == model:
            return stub
    raise AssertionError(f"no live stub for {model}")
