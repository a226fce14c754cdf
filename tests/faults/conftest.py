"""The fault matrix harness: one real tritonserver shared by the fault tests, and what each test checks.

Every fault test does something bad to the server and then holds it to the same four promises:
the client gets the exact error, good requests sent alongside all succeed (the client's
count equals the server's), the server is live and ready afterwards, and neither ``/dev/shm`` nor the
process table holds anything orphaned. ``good_traffic`` and the autouse ``server_survives`` check the
last three around every test that uses the shared server.

The shared server runs a small repository (recommender with declared id range, its embedding/dense
pipeline, trivial, a trivial with a tiny queue, the text-embedding service) under explicit model
control, so reload tests can load while others serve, with both fronts in front of it as ``make
serve`` runs it. Tests that must break a server (a corrupt model, a crash) start their own.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from harness import (
    GOOD_MODEL,
    PROTOCOLS,
    Traffic,
    assert_live_and_ready,
    orphans,
    revive,
    trivial_inputs,
    url,
)
from tritonclient.utils import InferenceServerException

from client.connection import connect
from client.stats import model_stats
from exporters.repository import build_repository
from exporters.schema.models import Spec, parse_spec
from server import ServerOptions, TritonServer
from tests.integration.counted import stats_counting

pytestmark = pytest.mark.integration


def _model(spec_data: dict[str, Any], base: str, **changes: Any) -> dict[str, Any]:
    model = copy.deepcopy(next(m for m in spec_data["models"] if m["name"] == base))
    model.update(changes)
    return model


@pytest.fixture(scope="session")
def fault_spec(spec_data: dict[str, Any]) -> Spec:
    recommender = _model(spec_data, "recommender", batching={"mode": "dynamic", "max_queue_delay_us": 1000})
    trivial = _model(spec_data, "trivial")
    tiny_queue = _model(
        spec_data,
        "trivial",
        name="trivial_tiny_queue",
        warmup=False,
        batching={
            "mode": "dynamic",
            "max_queue_delay_us": 50_000,
            "preferred_batch_sizes": [64],
            "queue": {"max_queue_size": 2},
        },
    )
    pipeline = {"name": "recommender_pipeline", "model": "recommender", "split": "embedding_dense"}
    text = {**spec_data["text_embeddings"][0], "max_seq_length": 16, "buckets": [16]}  # one length: quick
    return parse_spec(
        {"models": [recommender, trivial, tiny_queue], "pipelines": [pipeline], "text_embeddings": [text]}
    )


@pytest.fixture(scope="session")
def fault_repository(fault_spec: Spec, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from exporters.pipelines.build import build_pipelines
    from exporters.text.embedding import build_text_embeddings

    repository = tmp_path_factory.mktemp("fault_repository")
    build_repository(fault_spec, repository, num_gpus=0)
    build_pipelines(fault_spec, repository, num_gpus=0)
    build_text_embeddings(fault_spec.text_embeddings, repository, num_gpus=0)
    return repository


@pytest.fixture(scope="session")
def fault_server(fault_repository: Path) -> Iterator[TritonServer]:
    options = ServerOptions(
        repository=fault_repository,
        startup_timeout_s=240,
        http_front=True,  # what `make serve` runs: HTTP faults go through the front, as a user's would
        http_front_body_timeout_s=3,
        http_front_header_timeout_s=2,
        grpc_front=True,  # and gRPC ones through the gRPC front
    )
    with TritonServer(options) as running:
        assert running.failed_models == {}, running.describe_failures()
        yield running
    assert not orphans(running), "the stopped server left stubs or /dev/shm regions behind"


@pytest.fixture(autouse=True)
def server_survives(request: pytest.FixtureRequest) -> Iterator[None]:
    """After every test on the shared server: live, ready, nothing orphaned. A server that died during
    the test fails that test with the cause, and is started again for the tests after it (``revive``):
    one death, whoever caused it, costs the test it happened in, not the rest of the run."""
    yield
    if "fault_server" not in request.fixturenames:
        return
    server = request.getfixturevalue("fault_server")
    cause = revive(server)
    assert cause is None, f"tritonserver died during this test ({cause}); started again for the next tests"
    assert_live_and_ready(server)
    assert not orphans(server), orphans(server)


@pytest.fixture
def good_traffic(fault_server: TritonServer):
    """``with good_traffic() as traffic:`` runs good requests on ``trivial`` over both protocols until
    the block ends (and at least ``minimum`` of them), then asserts every one succeeded and that the
    server counted exactly as many successes as the client did (the server's count is comparable:
    good requests never fail, see test_statistics)."""

    class Running:
        def __init__(self, minimum: int = 20, server_count: bool = True) -> None:
            self.minimum = minimum
            self.server_count = server_count  # False where the fault resets the counters (a reload)
            self.traffic = Traffic()
            self.stop = threading.Event()
            self.lock = threading.Lock()

        def _loop(self, protocol: str) -> None:
            client = connect(protocol, url(fault_server, protocol))
            inputs = trivial_inputs(protocol)
            while not self.stop.is_set() or self.traffic.sent < self.minimum:
                try:
                    result = client.infer(GOOD_MODEL, inputs)
                    assert np.array_equal(result.as_numpy("y"), np.full((1, 16), 2.0, np.float32))
                    outcome = None
                except (InferenceServerException, AssertionError) as error:
                    outcome = f"{protocol}: {error}"
                with self.lock:
                    self.traffic.sent += 1
                    if outcome is None:
                        self.traffic.ok += 1
                    else:
                        self.traffic.failures.append(outcome)
                time.sleep(0.005)
            client.close()  # in this thread: the gevent pool cannot be joined from the collector's

        def __enter__(self) -> Traffic:
            with connect("grpc", fault_server.grpc_url) as stats:
                self.before = model_stats(stats, "grpc", GOOD_MODEL)
            self.threads = [threading.Thread(target=self._loop, args=(p,), daemon=True) for p in PROTOCOLS]
            for thread in self.threads:
                thread.start()
            return self.traffic

        def __exit__(self, *exc_info: object) -> None:
            self.stop.set()
            for thread in self.threads:
                thread.join(timeout=60)
            if exc_info[0] is not None:
                return
            traffic = self.traffic
            assert traffic.failures == [], traffic.failures[:5]
            assert traffic.ok == traffic.sent >= self.minimum
            if self.server_count:  # read once Triton has counted the last answers (one sample each)
                with connect("grpc", fault_server.grpc_url) as stats:
                    counted = stats_counting(stats, "grpc", GOOD_MODEL, self.before, traffic.ok)
                assert counted.requests == traffic.ok, "server count != client count"

    return Running
