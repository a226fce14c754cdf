"""One real tritonserver for the serving tests, on free ports, always stopped; and its build, reused.

Starting a server and exporting models are what the integration tests spend their time on, so the
tests that only send requests share one repository and one server: every model, pipeline and text
embedding of ``models.yaml``, plus test-only variants:

* ``recommender_batch_of_four``: a batcher that holds requests until four are queued (``batched.py``),
  so four sent concurrently share a batch however late a busy machine sends one;
* ``recommender_tiny_queue``: a queue of 2 behind a 500 ms batcher, so a burst is provably rejected,
  not queued without bound, however slowly a busy machine sends it;
* ``image_classifier_pipeline_hybrid``: the image classifier cut into three stages at given cut points,
  bf16 boundaries, two replicas of the middle stage;
* ``text_embedding_batch_of_four``: the fp32 text service, both stages holding requests until four are queued;
* ``recommender_pipeline_batch_of_four`` and ``image_classifier_pipeline_hybrid_batch_of_four``: those
  pipelines with a first stage that holds requests until four are queued, so requests sent as a group
  share its batch and are split back by the stages however late a busy machine sends one.

Tests that change what a server serves (live updates, version swaps) or that serve a repository of
their own start their own server; ``reuse_exports`` lets their build skip the exports this one made.
"""

from __future__ import annotations

import copy
import dataclasses
import shutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from batched import HOLDING

from exporters.pipelines.build import build_pipelines
from exporters.repository import build_repository
from exporters.schema.models import Spec, parse_spec
from exporters.text.embedding import build_text_embeddings
from perf.measure.engine import MeasureSettings
from perf.session.model import TUNE_WINDOWS
from server import ServerOptions, TritonServer

pytestmark = pytest.mark.integration
HYBRID = {
    "name": "image_classifier_pipeline_hybrid", "model": "image_classifier", "split": "blocks",
    "stages": 3, "cut_points": [2, 6], "replicas": [1, 2, 1], "boundary_dtype": "bf16",
}  # fmt: skip
TEXT_GROUP = "text_embedding_batch_of_four"
GROUPED_PIPELINES = ("recommender_pipeline", HYBRID["name"])  # each also served as <name>_batch_of_four
ReuseExports = Callable[[Path, Mapping[str, str]], None]
# The tuner's windows in tests: a short warm-up and never more than the three windows that count.
# One run per measurement: on these VMs most runs see some steal, and measuring each again doubles a
# tuner test. The policy's second run is tested on the simulated server (tests/unit/perf/tune/test_tuner.py).
# A p99 on 10 requests: the windows of a search's low rates are still sized and judged by the rule, on
# seconds rather than minutes (the rule's own figures: tests/unit/perf/measure/test_engine.py).
QUICK_WINDOWS = dataclasses.replace(
    TUNE_WINDOWS,
    warmup_s=0.2,
    max_windows=TUNE_WINDOWS.stable_windows,
    remeasure_stolen=False,
    p99_samples=10,
)


def _variant(spec_data: dict[str, Any], base: str, name: str, batching: dict[str, Any]) -> dict[str, Any]:
    model = copy.deepcopy(next(m for m in spec_data["models"] if m["name"] == base))
    model.update(name=name, batching=batching, warmup=False)
    return model


@pytest.fixture(scope="session")
def serving_spec(spec_data: dict[str, Any]) -> Spec:
    data = copy.deepcopy(spec_data)
    data["models"] += [
        _variant(spec_data, "recommender", "recommender_batch_of_four", HOLDING),
        _variant(
            spec_data,
            "recommender",
            "recommender_tiny_queue",
            {
                "mode": "dynamic",
                "max_queue_delay_us": 500_000,
                "preferred_batch_sizes": [64],
                "queue": {"max_queue_size": 2},
            },
        ),
    ]
    pipelines = [*data.get("pipelines", []), HYBRID]
    data["pipelines"] = pipelines + [
        {**p, "name": f"{p['name']}_batch_of_four", "batching": HOLDING}
        for p in pipelines
        if p["name"] in GROUPED_PIPELINES
    ]
    data["text_embeddings"].append({**data["text_embeddings"][0], "name": TEXT_GROUP, "batching": HOLDING})
    return parse_spec(data)


@pytest.fixture(scope="session")
def serving_repository(serving_spec: Spec, tmp_path_factory: pytest.TempPathFactory) -> Path:
    repository = tmp_path_factory.mktemp("repository")
    build_repository(serving_spec, repository, num_gpus=0)
    build_pipelines(serving_spec, repository, num_gpus=0)
    build_text_embeddings(serving_spec.text_embeddings, repository, num_gpus=0)
    return repository


@pytest.fixture(scope="session")
def server(serving_repository: Path) -> Iterator[TritonServer]:
    # About thirty Python-backend stubs, a dozen of them importing torch: on a loaded 2-core machine
    # their start can take minutes; the allowance is a hang guard, nothing here times the server.
    with TritonServer(ServerOptions(repository=serving_repository, startup_timeout_s=540)) as running:
        assert running.failed_models == {}, running.describe_failures()
        yield running
        # No drain at the end (the fault tests check draining): unloading thirty stubs took 80 s on a
        # busy machine. Killed, the server is then cleaned up by stop(): its stubs and regions removed.
        running.process.kill()
        running.process.wait(timeout=60)


@pytest.fixture(scope="session")
def reuse_exports(serving_repository: Path) -> ReuseExports:
    """``reuse_exports(repository, {folder: shared folder})`` copies folders of the shared build into
    ``repository`` before a test builds its own there.

    Each exporter checks the content hash and file checksum of what it finds and exports again on any
    difference, so a copy can only save time: the build that follows still decides what is served.
    """

    def copy_folders(repository: Path, folders: Mapping[str, str]) -> None:
        for target, source in folders.items():
            shutil.copytree(serving_repository / source, repository / target, dirs_exist_ok=True)

    return copy_folders


@pytest.fixture
def quick_windows() -> MeasureSettings:
    """The windows ``make tune`` and ``make plan`` run with in a test (``TuneSetup.windows``,
    ``PlanSetup.windows``): short, one run per measurement. A test checks that the pieces fit, not
    what they measure."""
    return QUICK_WINDOWS
