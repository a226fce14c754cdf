"""Fault matrix, serving-resilience rows: one real server, faults injected under load.

In order, the module tells one story: the admin APIs refuse strangers (row 4); a version that fails
to load leaves the old one serving and the server ready (row 3); embedding updates are acknowledged,
then the server is drained under load over both protocols and restarted, and the updates are still
there (row 2, and persistence across a server restart); a killed stub of the restarted server is healed
under load with those updates intact (row 1). Each test also runs alone (``-k``): the heal test then
starts its own server and gives it the same updates.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from resilience_fixtures import (
    EMBEDDING,
    PIPELINE,
    MixedLoad,
    acknowledged_updates,
    build_small_repository,
    client_health,
    explicit_options,
    infer_once,
    pipeline_answer,
    server_success_count,
    shm_regions,
    stub_of,
)
from stub_mutex import kill_owning_none
from tritonclient.utils import InferenceServerException

from client.infer import make_inputs
from server import TritonServer
from server.admin import ADMIN_HEADER, GRPC_ADMIN_HEADER, AdminError, headers, load_model
from server.stubs import server_stubs, stubs_with_prefix
from server.watchdog import DIED, Watchdog, what_happened
from soak.mixed_load import refused_cleanly

pytestmark = pytest.mark.integration
RESTRICTED = {
    "http": f"This API is restricted, expecting header '{ADMIN_HEADER}'",
    "grpc": f"This protocol is restricted, expecting header '{GRPC_ADMIN_HEADER}'",
}


@pytest.fixture(scope="module")
def repository(spec_data: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_small_repository(spec_data, tmp_path_factory.mktemp("resilience_repository"))


@pytest.fixture(scope="module")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    with TritonServer(explicit_options(repository, tmp_path_factory.mktemp("server_workdir"))) as running:
        yield running


@dataclass
class Restart:
    """The second server of the module (started by the drain test on the same repository)."""

    repository: Path
    workdir: Path
    server: TritonServer | None = None
    expected: np.ndarray | None = None  # the pipeline's answer after the acknowledged updates

    def start(self) -> TritonServer:
        self.server = TritonServer(explicit_options(self.repository, self.workdir)).start()
        return self.server


@pytest.fixture(scope="module")
def restart(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Restart]:
    holder = Restart(repository, tmp_path_factory.mktemp("restart_workdir"))
    yield holder
    if holder.server is not None:
        holder.server.stop()


@pytest.fixture
def clients(server: TritonServer) -> Iterator[tuple[httpclient.InferenceServerClient, Any]]:
    """An HTTP and a gRPC client of ``server``, without the admin key, closed when the test ends
    (``pipeline_answer`` says why)."""
    with (
        httpclient.InferenceServerClient(server.http_url) as http_client,
        grpcclient.InferenceServerClient(server.grpc_url) as grpc_client,
    ):
        yield http_client, grpc_client


def _assert_live_ready(server: TritonServer) -> None:
    with httpclient.InferenceServerClient(server.http_url) as http_client:
        assert http_client.is_server_ready()
    with grpcclient.InferenceServerClient(server.grpc_url) as grpc_client:
        assert grpc_client.is_server_ready()


@pytest.fixture
def updated_server(restart: Restart) -> TritonServer:
    """The server the drain test restarted, holding its updates; when the heal test runs alone (or the
    drain test failed before restarting), a new server on the same repository given the same updates."""
    if restart.server is None:
        restart.expected = acknowledged_updates(restart.start().http_url)
    assert restart.server is not None
    return restart.server


def test_admin_apis_need_the_key_and_file_overrides_are_refused(
    server: TritonServer, clients: tuple[httpclient.InferenceServerClient, Any]
) -> None:
    """Row 4: load/unload/index without the key are refused on both protocols; code by file override is
    refused by our loader even with the key; inference is unaffected."""
    plain_http, plain_grpc = clients
    model_py = b"import os\nos.system('touch /tmp/pwned')\n"
    attempts = {
        "http load": lambda: plain_http.load_model("trivial"),
        "http load with code": lambda: plain_http.load_model(
            "evil", config='{"backend": "python"}', files={"file:1/model.py": model_py}
        ),
        "http unload": lambda: plain_http.unload_model("trivial"),
        "http index": lambda: plain_http.get_model_repository_index(),
        "grpc load": lambda: plain_grpc.load_model("trivial"),
        "grpc unload": lambda: plain_grpc.unload_model("trivial"),
    }
    for what, attempt in attempts.items():
        with pytest.raises(InferenceServerException) as refused:
            attempt()
        assert refused.value.message() == RESTRICTED[what.split()[0]], what
        assert refused.value.status() in ("403", "StatusCode.UNAVAILABLE"), what
    with pytest.raises(AdminError, match="file overrides refused"):
        load_model(plain_http, server.admin_key, "evil", files={"file:1/model.py": model_py})
    index = plain_http.get_model_repository_index(headers=headers(server.admin_key))
    assert "evil" not in {m["name"] for m in index}
    keyed = plain_grpc.get_model_repository_index(headers=headers(server.admin_key, "grpc"), as_json=True)
    assert {m["name"] for m in keyed["models"]} == {m["name"] for m in index}
    before = server_success_count(server.http_url, "trivial")
    for client, protocol in ((plain_http, "http"), (plain_grpc, "grpc")):
        for _ in range(5):
            infer_once(client, protocol, "trivial")
    assert server_success_count(server.http_url, "trivial", at_least=before + 10) - before == 10
    _assert_live_ready(server)


def _live_stubs(server: TritonServer, model: str) -> int:
    return sum(1 for s in server_stubs(server.pid) if s.alive and s.model == model and s.instance != model)


def test_a_reload_with_fewer_instances_is_not_healed_as_a_dead_stub(
    server: TritonServer, clients: tuple[httpclient.InferenceServerClient, Any]
) -> None:
    """Scaling a model down through the repository API retires a stub on purpose: the watchdog must
    leave it (it used to reload the model mid-traffic, as if the stub had been killed).

    A watchdog of our own, polled once by hand (``check_once``) after the ×2 → ×1 load, judges the
    retired stub; ``stop`` waits for the judgement it started, so no sleep has to outlast the
    server's own watchdog."""
    client, _ = clients
    original = client.get_model_config("trivial")
    assert server.watchdog is not None
    events_before = len(server.watchdog.state.events)
    probe = Watchdog(server.pid, server.triton_http_url, server.admin_key, events_path=None)
    try:
        for count in (2, 1):
            config = {**original, "instance_group": [{"kind": "KIND_CPU", "count": count}]}
            load_model(client, server.admin_key, "trivial", config=config)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and _live_stubs(server, "trivial") != count:
                time.sleep(0.1)
            assert _live_stubs(server, "trivial") == count
            if count == 2:
                probe.dead_stubs()  # it knows both stubs before one of them is retired
        started = probe.check_once()
        probe.stop()
        assert "trivial" in started  # it saw the retired stub exit and judged it ...
        assert [e for e in probe.state.events if e.model == "trivial"] == []  # ... a retirement
        assert probe.state.unavailable_now == {}
        assert server.watchdog.state.events[events_before:] == []
        infer_once(client, "http", "trivial")
    finally:
        probe.stop()
        load_model(client, server.admin_key, "trivial", config=original)


def test_failed_new_version_keeps_old_serving_and_server_ready(
    server: TritonServer, repository: Path, clients: tuple[httpclient.InferenceServerClient, Any]
) -> None:
    """Row 3: a new version that fails to load is named; the old one serves; ready stays true."""
    broken = repository / "trivial" / "2"
    broken.mkdir()
    good = (repository / "trivial" / "1" / "model.onnx").read_bytes()
    (broken / "model.onnx").write_bytes(good[: len(good) // 3])  # truncated
    client, _ = clients
    try:
        with pytest.raises(AdminError) as failed:
            load_model(client, server.admin_key, "trivial")
        message = str(failed.value)
        assert message.startswith("load of 'trivial' failed:") and "version 2" in message, message
        assert message.endswith("; version 1 keeps serving"), message
        _assert_live_ready(server)
        answer = client.infer("trivial", make_inputs(httpclient, {"x": np.ones((1, 16), np.float32)}))
        assert answer.get_response()["model_version"] == "1"
        code, text = client_health(server, "trivial")
        assert code == 0, text
        assert "trivial: READY (serving version 1); version 2 failed to load:" in text, text
    finally:
        shutil.rmtree(broken)


def test_drain_under_load_loses_nothing_and_updates_survive_restart(
    server: TritonServer, restart: Restart
) -> None:
    """Row 2: stop() under load over HTTP and gRPC: every request admitted before the drain succeeds, the
    rest are refused cleanly, the server exits 0 with no stub or shared memory left; a new server on the
    same repository answers with the acknowledged embedding updates (write-ahead log)."""
    before = pipeline_answer(server.http_url)
    restart.expected = acknowledged_updates(server.http_url)
    assert not np.array_equal(before, restart.expected), "the updates must change the answer"
    load = MixedLoad(server.http_url, server.grpc_url, ["trivial", PIPELINE], callers_per=2).start()
    try:
        load.wait_for(60)
        drain_started = time.monotonic()
        server.stop()
    finally:
        load.stop()
    assert not any(caller.is_alive() for caller in load.callers), "a request never came back"
    assert server.process is not None and server.process.returncode == 0, server.log_tail()
    # the drain itself ended (every model unloaded, every stub gone), not its timeout: how long it took
    # is the host's speed, so it is not asserted
    assert server.drain_finished_at is not None, "the drain was given up at its timeout"
    admitted = [o for o in load.outcomes if o.sent < drain_started]
    lost = [o for o in admitted if o.error]
    assert not lost, {o.error for o in lost}
    unclean = {f.error for f in load.outcomes if f.error and not refused_cleanly(f, server.drain_finished_at)}
    assert not unclean, unclean  # a CANCELLED call sent before the drain had finished counts here
    assert {o.protocol for o in admitted if not o.error} == {"http", "grpc"}
    assert stubs_with_prefix(server.shm_prefix) == [] and shm_regions(server.shm_prefix) == []
    restarted = restart.start()
    answer = pipeline_answer(restarted.http_url)
    np.testing.assert_array_equal(answer, restart.expected)


def test_killed_stub_is_healed_under_load_and_keeps_live_updates(
    updated_server: TritonServer, restart: Restart
) -> None:
    """Row 1: kill -9 the embedding stage's stub under load: the watchdog reloads it, the pipeline
    serves again with every acknowledged row update, other models never fail. How fast it heals is
    measured and reported by ``make soak``; the wait here is only a hang guard. The kill lands while
    the stub owns none of the Python backend's mutexes (``kill_owning_none``): one that lands on the
    pool mutex aborts 2.51 itself, a limit the supervisor covers (row 27), not the watchdog."""
    server = updated_server
    stub = stub_of(server.pid, EMBEDDING)
    trivial_before = server_success_count(server.http_url, "trivial")  # warm-up requests count too
    load = MixedLoad(server.http_url, server.grpc_url, ["trivial", PIPELINE]).start()
    try:
        load.wait_for(40)
        killed_at = time.monotonic()
        ours = kill_owning_none(stub.pid, stub.shm_region)
        deadline = killed_at + 180
        while time.monotonic() < deadline and not load.ok(
            lambda o: o.model == PIPELINE and o.sent > killed_at + 0.5
        ):
            time.sleep(0.1)
        back = load.ok(lambda o: o.model == PIPELINE and o.sent > killed_at + 0.5)
        assert back, "the pipeline never answered again"
        recovered_after = back[0].received - killed_at
        load.wait_for(len(load.ok()) + 20)
    finally:
        load.stop()
    failures = [o for o in load.outcomes if o.error]
    assert all(f.model == PIPELINE for f in failures), [f.error for f in failures if f.model != PIPELINE]
    dead = f"Stub process '{EMBEDDING}_0_0' is not healthy."
    assert all(dead in f.error for f in failures), {f.error for f in failures}
    assert all(f.sent < killed_at + recovered_after for f in failures)
    trivial_ok = len(load.ok(lambda o: o.model == "trivial"))
    counted = server_success_count(server.http_url, "trivial", at_least=trivial_before + trivial_ok)
    assert counted - trivial_before == trivial_ok
    np.testing.assert_array_equal(pipeline_answer(server.http_url), restart.expected)
    assert stub.shm_region not in shm_regions(server.shm_prefix), "the dead stub's region was left behind"
    code, text = client_health(server)
    assert code == 0, text
    cause = what_happened(DIED if ours else "stopped, state T")  # or the watchdog saw our stop first
    assert f"watchdog: stub of {EMBEDDING}_0_0 (pid {stub.pid}) {cause} at" in text, text
    assert "reloaded in" in text, text
    _assert_live_ready(server)
    assert not any(caller.is_alive() for caller in load.callers), (
        "a request in flight when the stub died never came back"
    )
