"""Fault matrix rows: embedding updates belong to the build they update.

A rebuild with new weights (``seed: 1``) while the pipeline serves acknowledged row updates: the server
keeps serving the old build whole until its models are reloaded; a stub reload under the old config
refuses the new artifact instead of serving it beside the old dense stage; reloading one stage from the
repository cannot chain with the other (the boundary tensor is named for its build), so requests fail
rather than mix; once every model is reloaded the answers are the new build's, with no old update
replayed onto it (the old log is set aside beside it, and the stage says so in the server log).

An update request that also carries ids to look up used to answer the update and drop the lookup:
refused whole with a 400 / INVALID_ARGUMENT naming both, nothing applied.

Each test starts its own real server on a small repository (it rebuilds or updates it).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from harness import trivial_inputs
from resilience_fixtures import explicit_options, wait_for
from stub_mutex import kill_owning_none
from tritonclient.utils import InferenceServerException

from client.infer import make_inputs
from exporters.pipelines.build import build_pipelines
from exporters.pipelines.live import embedding_update
from exporters.repository import build_repository
from exporters.schema.models import ModelSpec, parse_spec
from exporters.sources.inputs import draw_inputs
from exporters.sources.load import build_torch_model
from python_backend.torch_stage.update_log import LOG_NAME
from server import TritonServer
from server.admin import load_model
from server.records import read_record
from server.stubs import server_stubs

pytestmark = pytest.mark.integration
PIPELINE = "recommender_pipeline"
EMBEDDING, DENSE = f"{PIPELINE}_embedding", f"{PIPELINE}_dense"
WIDTH = 8
STALE = "is not the artifact this config was built with"


def _spec_data(spec_data: dict[str, Any], seed: int) -> dict[str, Any]:
    """trivial, a small recommender (``seed``) and its embedding/dense pipeline with live updates."""
    data = copy.deepcopy(spec_data)
    data["models"] = [m for m in data["models"] if m["name"] in ("trivial", "recommender")]
    recommender = next(m for m in data["models"] if m["name"] == "recommender")
    recommender.update(seed=seed, batching={"mode": "dynamic", "max_queue_delay_us": 1000})
    recommender["options"] = {"table_sizes": [100] * 8, "embedding_dim": WIDTH, "bottom": [32], "top": [32]}
    next(t for t in recommender["inputs"] if t["name"] == "sparse_ids")["range"] = [0, 100]
    data["pipelines"] = [p for p in data["pipelines"] if p["name"] == PIPELINE]
    assert data["pipelines"][0].get("live_updates")
    data.pop("text_embeddings", None)
    return data


def _build(spec_data: dict[str, Any], repository: Path, seed: int) -> ModelSpec:
    spec = parse_spec(_spec_data(spec_data, seed))
    build_repository(spec, repository, num_gpus=0)
    build_pipelines(spec, repository, num_gpus=0)
    return spec.model("recommender")


@pytest.fixture
def served(spec_data: dict[str, Any], tmp_path: Path) -> Iterator[tuple[TritonServer, ModelSpec, Path]]:
    repository = tmp_path / "repository"
    model = _build(spec_data, repository, seed=0)
    with TritonServer(explicit_options(repository, tmp_path / "server")) as server:
        assert server.failed_models == {}, server.describe_failures()
        yield server, model, repository


@dataclasses.dataclass
class Probe:
    """One fixed pipeline request, and what the model in a given state answers to it."""

    model: ModelSpec
    dense: np.ndarray
    ids: np.ndarray

    def expected(self, seed: int, updates: list[tuple[int, np.ndarray, np.ndarray]]) -> np.ndarray:
        module = build_torch_model(dataclasses.replace(self.model, seed=seed))
        with torch.no_grad():
            for table, rows, values in updates:
                module.embed.tables[table].weight[torch.from_numpy(rows)] = torch.from_numpy(values)
            return module(torch.from_numpy(self.dense), torch.from_numpy(self.ids)).numpy()

    def ask(self, url: str) -> np.ndarray | str:
        """The pipeline's answer, or the error it gave."""
        client = httpclient.InferenceServerClient(url)
        try:
            arrays = {"dense": self.dense, "sparse_ids": self.ids}
            return client.infer(PIPELINE, make_inputs(httpclient, arrays)).as_numpy("probability")
        except InferenceServerException as error:
            return str(error)


def _probe(model: ModelSpec) -> Probe:
    dense, ids = draw_inputs(model, 4, seed=3, model=build_torch_model(model))
    return Probe(model, dense, ids)


def _update(url: str, table: int, rows: np.ndarray, value: float) -> tuple[int, np.ndarray, np.ndarray]:
    values = np.full((len(rows), WIDTH), value, np.float32)
    client = httpclient.InferenceServerClient(url)
    client.infer(EMBEDDING, make_inputs(httpclient, embedding_update(table, rows, values)))
    return table, rows, values


def _same(answer: np.ndarray | str, expected: np.ndarray) -> bool:
    return not isinstance(answer, str) and np.allclose(answer, expected, rtol=1e-4, atol=1e-6)


def _watchdog_outcome(server: TritonServer, stub_pid: int) -> dict:
    """The watchdog's record of what it did about ``stub_pid`` (healed it, or why it could not)."""

    def acted() -> list[dict]:
        events = read_record(server.watchdog_path).get("events", [])
        return [e for e in events if e["stub_pid"] == stub_pid and (e.get("healed_at") or e.get("error"))]

    return wait_for(acted, f"the watchdog to act on stub {stub_pid}")[-1]


def test_a_rebuild_never_replays_old_updates_or_serves_two_builds(
    served: tuple[TritonServer, ModelSpec, Path], spec_data: dict[str, Any]
) -> None:
    server, model, repository = served
    probe = _probe(model)
    updates = [
        _update(server.http_url, 0, probe.ids[:, 0], 0.5),
        _update(server.http_url, 1, probe.ids[:, 1], -0.5),
    ]
    old = probe.expected(seed=0, updates=updates)
    assert _same(probe.ask(server.http_url), old)
    new = probe.expected(seed=1, updates=[])
    mixed = probe.expected(seed=1, updates=updates)  # what replaying the old log onto new weights gives
    assert not np.allclose(old, new, rtol=1e-3) and not np.allclose(mixed, new, rtol=1e-3)

    _build(spec_data, repository, seed=1)  # the server keeps serving the build it loaded, whole
    answers = [probe.ask(server.http_url)]
    assert _same(answers[0], old), answers[0]

    # A stub death: the watchdog reloads the stage with the config it serves, from the rebuilt folder.
    stub = next(s for s in server_stubs(server.pid) if s.alive and s.model == EMBEDDING)
    kill_owning_none(stub.pid, stub.shm_region)  # not on a mutex: that aborts 2.51 itself
    outcome = _watchdog_outcome(server, stub.pid)
    assert STALE in outcome.get("error", ""), outcome
    answers.append(probe.ask(server.http_url))

    # One stage reloaded from the repository: it cannot be chained with the other stage's build.
    # (A load on a busy machine can take minutes: the timeout is a hang guard.)
    client = httpclient.InferenceServerClient(server.triton_http_url, network_timeout=600)
    load_model(client, server.admin_key, EMBEDDING)
    answers.append(probe.ask(server.http_url))
    assert all(isinstance(a, str) or _same(a, old) for a in answers), answers  # old whole, or an error

    for name in (DENSE, PIPELINE):  # the rest of the build: the pipeline serves again
        load_model(client, server.admin_key, name)
    answer = probe.ask(server.http_url)
    assert _same(answer, new), (answer, new)  # no old update replayed onto the new weights
    assert (
        len(list((repository / EMBEDDING / "1").glob(f"{LOG_NAME}.set-aside-*"))) == 1
    )  # kept, not replayed
    assert "set aside as" in server.log_path.read_text()
    later = _update(server.http_url, 2, probe.ids[:, 2], 0.25)  # updates apply to the new build
    assert _same(probe.ask(server.http_url), probe.expected(seed=1, updates=[later]))


def _mixed_request(protocol: str, probe: Probe) -> tuple[Any, list]:
    module = httpclient if protocol == "http" else grpcclient
    arrays = {
        **embedding_update(0, probe.ids[:1, 0], np.ones((1, WIDTH), np.float32)),
        "sparse_ids": probe.ids[:1],
    }
    return module, make_inputs(module, arrays)


def test_an_update_that_also_carries_ids_is_refused_naming_both(
    served: tuple[TritonServer, ModelSpec, Path],
) -> None:
    server, model, _ = served
    probe = _probe(model)
    before = probe.ask(server.http_url)
    for protocol, url, code in (
        ("http", server.http_url, "400"),
        ("grpc", server.grpc_url, "INVALID_ARGUMENT"),
    ):
        module, inputs = _mixed_request(protocol, probe)
        client = module.InferenceServerClient(url)
        with pytest.raises(InferenceServerException) as refused:
            client.infer(EMBEDDING, inputs)
        assert code in str(refused.value.status()), (protocol, refused.value)
        for name in ("update_table", "update_row", "update_values", "sparse_ids"):
            assert name in refused.value.message(), refused.value.message()
        assert _same(probe.ask(server.http_url), before), "the refused update was applied"
        answer = client.infer("trivial", trivial_inputs(protocol)).as_numpy("y")  # the server serves on
        assert np.array_equal(answer, np.full((1, 16), 2.0, np.float32))
