"""Parameters of ``recommender_pipeline`` changed while it serves steady load (explicit model control).

Load: a closed loop of pipeline requests for one fixed input, from several callers at once. During it,
embedding row updates arrive (each changes rows of two tables at once, so a half-applied update would
give an answer that matches no state), then a new version of the dense stage is loaded. Checks: no
request fails, every answer equals the model in some whole state, answers afterwards reflect the change.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
import tritonclient.http as httpclient

from client.infer import make_inputs
from exporters.pipelines.build import build_pipelines
from exporters.pipelines.live import embedding_update, publish_dense_version
from exporters.repository import build_repository
from exporters.schema.models import Spec, parse_spec
from exporters.sources.inputs import draw_inputs
from exporters.sources.load import build_torch_model
from python_backend.torch_stage.embedding_rows import UPDATE_ROW, UPDATE_VERSION
from server import ServerOptions, TritonServer
from server.admin import headers as admin_headers

pytestmark = pytest.mark.integration
PIPELINE = "recommender_pipeline"
EMBEDDING, DENSE = f"{PIPELINE}_embedding", f"{PIPELINE}_dense"
CALLERS = 4


@pytest.fixture(scope="module")
def spec(spec_data: dict[str, Any]) -> Spec:
    data = copy.deepcopy(spec_data)
    data["models"] = [m for m in data["models"] if m["name"] == "recommender"]
    data["pipelines"] = [p for p in data["pipelines"] if p["name"] == PIPELINE]
    return parse_spec(data)


@pytest.fixture(scope="module")
def repository(spec: Spec, tmp_path_factory: pytest.TempPathFactory, reuse_exports):
    """A repository of its own (the tests change what it serves), built from the shared build's files."""
    path = tmp_path_factory.mktemp("live_repository")
    reuse_exports(path, {name: name for name in ("recommender", *spec.pipeline(PIPELINE).repository_names)})
    build_repository(spec, path, num_gpus=0)
    build_pipelines(spec, path, num_gpus=0)
    return path


@pytest.fixture(scope="module")
def server(repository) -> Iterator[TritonServer]:
    options = ServerOptions(repository=repository, startup_timeout_s=240)
    with TritonServer(options) as running:
        yield running


def _infer(client: httpclient.InferenceServerClient, model: str, arrays: dict[str, np.ndarray], output: str):
    return client.infer(model, make_inputs(httpclient, arrays)).as_numpy(output)


class SteadyLoad:
    """``CALLERS`` threads, each with its own connection, sending the same request back to back."""

    def __init__(self, url: str, arrays: dict[str, np.ndarray]) -> None:
        self.url, self.arrays = url, arrays
        self.answers: list[np.ndarray] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(CALLERS)]
        self._lock = threading.Lock()

    def _loop(self) -> None:
        client = httpclient.InferenceServerClient(self.url)
        try:
            while not self._stop.is_set():
                try:
                    answer = _infer(client, PIPELINE, self.arrays, "probability")
                except Exception as error:  # every failure is recorded; the test asserts there are none
                    with self._lock:
                        self.failures.append(repr(error))
                    continue
                with self._lock:
                    self.answers.append(answer)
        finally:
            client.close()

    def wait_for_answers(self, more: int, timeout_s: float = 30.0) -> None:
        """Block until ``more`` further answers arrived, so changes land between requests in flight."""
        target = len(self.answers) + more
        deadline = threading.Event()
        timer = threading.Timer(timeout_s, deadline.set)
        timer.start()
        while len(self.answers) < target and not deadline.wait(0.005):
            pass
        timer.cancel()

    def __enter__(self) -> SteadyLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)


@pytest.fixture()
def client(server: TritonServer) -> Iterator[httpclient.InferenceServerClient]:
    connection = httpclient.InferenceServerClient(server.http_url)
    yield connection
    connection.close()


@pytest.fixture(scope="module")
def request_arrays(spec: Spec) -> dict[str, np.ndarray]:
    model_spec = spec.model("recommender")
    dense, ids = draw_inputs(model_spec, 4, seed=21, model=build_torch_model(model_spec))
    return {"dense": dense, "sparse_ids": ids}


def _matches_one_of(answer: np.ndarray, states: list[np.ndarray]) -> bool:
    return any(np.allclose(answer, state, rtol=1e-4, atol=1e-6) for state in states)


def test_embedding_updates_under_load(server, client, spec: Spec, request_arrays) -> None:
    model = build_torch_model(spec.model("recommender"))
    dense, ids = (torch.from_numpy(request_arrays[k]) for k in ("dense", "sparse_ids"))
    rng = np.random.default_rng(5)
    tables = model.embed.tables
    states = [model(dense, ids).detach().numpy()]
    updates = []
    for _ in range(12):
        # One request writes the looked-up rows of tables 0 and 1: atomic or visibly torn.
        update = {}
        for table in (0, 1):
            rows = ids[:, table].numpy()
            values = rng.standard_normal((len(rows), tables[table].embedding_dim)).astype(np.float32)
            part = embedding_update(table, rows, values)
            update = {k: np.concatenate([update[k], v]) if k in update else v for k, v in part.items()}
            with torch.no_grad():
                tables[table].weight[torch.from_numpy(rows)] = torch.from_numpy(values)
        updates.append(update)
        states.append(model(dense, ids).detach().numpy())
    with SteadyLoad(server.http_url, request_arrays) as load:
        for update in updates:
            versions = _infer(client, EMBEDDING, update, UPDATE_VERSION)
            assert versions.shape == (len(update[UPDATE_ROW]), 1)
            load.wait_for_answers(CALLERS * 2)
    assert load.failures == []
    assert load.answers, "the load sent no requests"
    torn = [a for a in load.answers if not _matches_one_of(a, states)]
    assert torn == [], f"{len(torn)} of {len(load.answers)} answers match no whole state"
    np.testing.assert_allclose(
        _infer(client, PIPELINE, request_arrays, "probability"), states[-1], rtol=1e-4, atol=1e-6
    )
    assert not _matches_one_of(states[-1], states[:1]), "the updates did not change the answer"


def test_rejected_update_changes_nothing(client, request_arrays) -> None:
    before = _infer(client, PIPELINE, request_arrays, "probability")
    update = embedding_update(0, np.array([1, 10**9]), np.ones((2, 32), np.float32))  # second row outside
    with pytest.raises(Exception, match=UPDATE_ROW):
        _infer(client, EMBEDDING, update, UPDATE_VERSION)
    np.testing.assert_array_equal(_infer(client, PIPELINE, request_arrays, "probability"), before)


def test_dense_version_swap_under_load(server, client, spec: Spec, repository, request_arrays) -> None:
    boundary = client.get_model_config(EMBEDDING)["output"][0]["name"]  # embeddings_<build id>
    embeddings = _infer(client, EMBEDDING, {"sparse_ids": request_arrays["sparse_ids"]}, boundary)
    old = _infer(client, PIPELINE, request_arrays, "probability")
    new_model = publish_dense_version(
        spec.pipeline(PIPELINE), spec.model("recommender"), repository, 2, seed=77
    )
    with torch.no_grad():
        new = new_model.dense(
            torch.from_numpy(request_arrays["dense"]), torch.from_numpy(embeddings.copy())
        ).numpy()
    assert not np.allclose(old, new, rtol=1e-3), "the new version must answer differently"
    with SteadyLoad(server.http_url, request_arrays) as load:
        load.wait_for_answers(CALLERS * 2)
        client.load_model(DENSE, headers=admin_headers(server.admin_key))
        assert client.is_model_ready(DENSE, "2")
        seen_new = threading.Event()
        for _ in range(200):
            if _matches_one_of(_infer(client, PIPELINE, request_arrays, "probability"), [new]):
                seen_new.set()
                break
    assert load.failures == []
    assert load.answers, "the load sent no requests"
    assert seen_new.is_set(), "answers never reflected the new dense version"
    assert all(_matches_one_of(a, [old, new]) for a in load.answers)
    assert not client.is_model_ready(DENSE, "1"), "the old version should be unloaded after the swap"
    np.testing.assert_allclose(
        _infer(client, PIPELINE, request_arrays, "probability"), new, rtol=1e-4, atol=1e-6
    )
