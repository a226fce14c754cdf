"""A real tritonserver for the integration tests, on free ports, always stopped.

The repository holds every model of ``models.yaml`` plus test-only variants: a recommender whose
batcher waits 300 ms (so concurrent requests provably share a batch) and one with a tiny queue (so
overload is rejected, not queued without bound).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exporters.repository import build_repository
from exporters.spec import Spec, parse_spec
from server import ServerOptions, TritonServer

pytestmark = pytest.mark.integration


def _variant(spec_data: dict[str, Any], base: str, name: str, batching: dict[str, Any]) -> dict[str, Any]:
    model = copy.deepcopy(next(m for m in spec_data["models"] if m["name"] == base))
    model.update(name=name, batching=batching, warmup=False)
    return model


@pytest.fixture(scope="session")
def serving_spec(spec_data: dict[str, Any]) -> Spec:
    data = copy.deepcopy(spec_data)
    data["models"] += [
        _variant(
            spec_data,
            "recommender",
            "recommender_slow_batcher",
            {"mode": "dynamic", "max_queue_delay_us": 300_000},
        ),
        _variant(
            spec_data,
            "recommender",
            "recommender_tiny_queue",
            {
                "mode": "dynamic",
                "max_queue_delay_us": 50_000,
                "preferred_batch_sizes": [64],
                "queue": {"max_queue_size": 2},
            },
        ),
    ]
    return parse_spec(data)


@pytest.fixture(scope="session")
def serving_repository(serving_spec: Spec, tmp_path_factory: pytest.TempPathFactory) -> Path:
    repository = tmp_path_factory.mktemp("repository")
    build_repository(serving_spec, repository, num_gpus=0)
    return repository


@pytest.fixture(scope="session")
def server(serving_repository: Path) -> Iterator[TritonServer]:
    with TritonServer(ServerOptions(repository=serving_repository, startup_timeout_s=240)) as running:
        yield running
