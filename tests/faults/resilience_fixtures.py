"""Helpers for the serving-resilience fault tests: a small repository, steady mixed load, embedding
updates, ``client health``, leak checks.

The load itself (``MixedLoad``) lives in ``soak.mixed_load``, shared with ``make soak``.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from client.__main__ import main as client_main
from client.infer import make_inputs
from exporters.pipelines.build import build_pipelines
from exporters.pipelines.live import embedding_update
from exporters.repository import build_repository
from exporters.schema.models import parse_spec
from server import ServerOptions, TritonServer
from server.proc_stat import running
from server.records import read_record
from server.stubs import Stub, server_stubs
from soak.mixed_load import PIPELINE, MixedLoad, Outcome, infer_once, request_arrays

__all__ = ["PIPELINE", "MixedLoad", "Outcome", "infer_once", "request_arrays"]

EMBEDDING = f"{PIPELINE}_embedding"
ROOT = Path(__file__).resolve().parents[2]
COUNT_WAIT_S = 60.0
HANG_GUARD_S = 300  # how long a fault test waits for something before it fails: a hang guard, not a bound


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


@contextlib.contextmanager
def small_server(
    spec_data: dict[str, Any], tmp_path_factory: pytest.TempPathFactory, name: str, pipeline: bool = True
) -> Iterator[TritonServer]:
    """A server of a test module's own, with its watchdog, on the small repository
    (``build_small_repository``; ``pipeline=False`` leaves the pipeline out); ``name`` names its folders."""
    repository = build_small_repository(
        spec_data, tmp_path_factory.mktemp(f"{name}_repository"), pipeline=pipeline
    )
    with TritonServer(explicit_options(repository, tmp_path_factory.mktemp(f"{name}_workdir"))) as running:
        yield running


def server_success_count(http_url: str, model: str, at_least: int = 0) -> int:
    """Successful inferences of ``model`` (all versions) as the server counts them, read once they
    reach ``at_least``: Triton counts a request as it releases it, just after its answer left, so a
    read right after the last answer can miss it (``COUNT_WAIT_S`` is a hang guard; the caller
    asserts the count)."""
    deadline = time.monotonic() + COUNT_WAIT_S
    with httpclient.InferenceServerClient(http_url) as client:
        while True:
            stats = client.get_inference_statistics(model)
            count = sum(int(s["inference_stats"]["success"]["count"]) for s in stats["model_stats"])
            if count >= at_least or time.monotonic() > deadline:
                return count
        time.sleep(0.05)


def shm_regions(prefix: str) -> list[str]:
    return sorted(p.name for p in Path("/dev/shm").glob(f"{prefix}*"))


def stub_of(server_pid: int, model: str) -> Stub:
    """``model``'s live stub in one server."""
    for stub in server_stubs(server_pid):
        if stub.alive and stub.model == model:
            return stub
    raise AssertionError(f"no live stub for {model}")


def update_embedding(url: str, table: int, rows: list[int], value: float) -> None:
    """One embedding update through the embedding stage; returns once it is acknowledged."""
    with httpclient.InferenceServerClient(url) as client:
        config = client.get_model_config(EMBEDDING)
        width = next(int(i["dims"][-1]) for i in config["input"] if i["name"] == "update_values")
        arrays = embedding_update(table, np.array(rows), np.full((len(rows), width), value, np.float32))
        client.infer(EMBEDDING, make_inputs(httpclient, arrays))


def acknowledged_updates(http_url: str) -> np.ndarray:
    """Three acknowledged updates (ids 0, 3, 6 of tables 0 and 1 take new values; the same each time,
    so applying them twice changes nothing); returns the pipeline's answer after them."""
    for step in range(3):
        update_embedding(http_url, table=step % 2, rows=[0, 3, 6], value=0.5 + step)
    return pipeline_answer(http_url)


def pipeline_answer(url: str, protocol: str = "http") -> np.ndarray:
    """The pipeline's answer to its fixed request, on a client of its own closed here. Every client of
    these tests is closed where it was opened: one left to the collector may be closed in a load's
    thread, where gevent (under tritonclient's HTTP client) has no hub, and pytest warns."""
    with (httpclient if protocol == "http" else grpcclient).InferenceServerClient(url) as client:
        return infer_once(client, protocol, PIPELINE)


def client_health(server: TritonServer, *models: str) -> tuple[int, str]:
    """``python -m client health`` on ``server`` with its key and watchdog record: (exit status, text)."""
    key = server.log_path.parent / "admin.key"
    key.write_text(server.admin_key)
    out = io.StringIO()
    argv = ["--url", server.http_url, "health", "--admin-key-file", str(key)]
    with contextlib.redirect_stdout(out):
        code = client_main([*argv, "--events", str(server.watchdog_path), *models])
    return code, out.getvalue()


def tree_environment() -> dict[str, str]:
    """The environment for ``python -m ...`` run in another folder: it imports this tree's code, not
    whichever checkout the virtual environment's editable install points at."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }


def explicit_options(repository: Path, workdir: Path) -> ServerOptions:
    """The fault tests' server: explicit model control, a generous start, a short exit timeout (after
    the drain nothing is in flight; it only bounds open HTTP connections)."""
    return ServerOptions(
        repository=repository, startup_timeout_s=240, exit_timeout_s=3,
        workdir=workdir,
    )  # fmt: skip


def wait_for(condition: Callable[[], Any], what: str, check: Callable[[], None] = lambda: None) -> Any:
    """``condition()``'s first truthy value, polled every 50 ms (``check()`` each time, to fail early);
    fails the test after ``HANG_GUARD_S``."""
    deadline = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < deadline:
        check()
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"gave up after {HANG_GUARD_S} s waiting for {what}")


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    return running(pid)


def wait_healed_or_dead(server: TritonServer, hung_pid: int, guard_s: float) -> None:
    """Until the embedding stage's hung stub ``hung_pid`` is gone, a new one serves the model and the
    watchdog marks nothing unavailable, or the server has died (``guard_s``: a hang guard)."""
    deadline = time.monotonic() + guard_s
    while time.monotonic() < deadline and server.process.poll() is None:
        live = [s for s in server_stubs(server.pid) if s.alive and s.model == EMBEDDING]
        fresh = [s for s in live if s.pid != hung_pid and s.instance != EMBEDDING]
        hung_gone = not any(s.pid == hung_pid for s in live)
        if hung_gone and fresh and not read_record(server.watchdog_path).get("unavailable_now"):
            return
        time.sleep(0.05)
    assert server.process.poll() is not None, f"{EMBEDDING} not healed in {guard_s} s"
