"""The study framework without a server: a study's calls follow the profile's options."""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import pytest

from perf.studies.framework import StudyContext
from perf.studies.profiles import get_profile

SERVER = types.SimpleNamespace(grpc_url="127.0.0.1:1", http_url="127.0.0.1:2")


def test_targets_follow_protocol_shared_memory_and_seed(model_spec, tmp_path: Path) -> None:
    spec = model_spec("recommender")
    profile = get_profile("quick", protocol="http", shared_memory=True, seed=5)
    target = StudyContext(profile, tmp_path, tmp_path).target(SERVER, spec, served_as="recommender_pipeline")
    assert (target.model, target.url, target.protocol, target.shared_memory) == (
        "recommender_pipeline", "127.0.0.1:2", "http", True,
    )  # fmt: skip
    other_seed = StudyContext(get_profile("quick", seed=6), tmp_path, tmp_path).target(SERVER, spec)
    assert other_seed.url == "127.0.0.1:1" and other_seed.protocol == "grpc"
    assert not np.array_equal(target.inputs["dense"], other_seed.inputs["dense"])


def test_open_loads_replay_the_trace_or_seeded_poisson(tmp_path: Path) -> None:
    trace = tmp_path / "gaps.txt"
    trace.write_text("0.01\n0.02\n")
    with_trace = StudyContext(get_profile("quick", trace=str(trace)), tmp_path, tmp_path).open_load(100.0)
    assert with_trace.name == f"trace {trace}" and with_trace.rate == pytest.approx(2 / 0.03)
    context = StudyContext(get_profile("quick", seed=3), tmp_path, tmp_path)
    first, again, shifted = (context.open_load(100.0, k).arrivals() for k in (1, 1, 2))
    times = [[next(it) for _ in range(5)] for it in (first, again, shifted)]
    assert times[0] == times[1] != times[2]
