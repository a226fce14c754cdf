"""Fault matrix row 79: right after the served config of a model changes, the fronts check its requests
against the new one.

``trivial``'s ``config.pbtxt`` is rewritten with another ``max_batch_size`` and the model loaded again
through the admin path (``server.admin.load_model``, what ``python -m server load`` runs, on Triton's
own port: no front sees the load), or tritonserver is started again on it (what the supervisor does
after a death; the fronts stay up). The very next requests, over HTTP and gRPC: a batch the new config
refuses gets the front's own refusal (400 / ``INVALID_ARGUMENT``, the front's words, so it never reached
Triton), a batch the new config accepts is answered. Before, the fronts kept checking against the config
from before for 5 s and more: a batch above the new limit reached Triton (refused there, in Triton's
words: ``[request id: <id_unknown>] inference request batch-size must be <= 8``), and a batch the new
config accepts but the old one did not was refused 400 by the front.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import tritonclient.http as httpclient
from google.protobuf import text_format
from harness import PROTOCOLS, revive, trivial_inputs, url
from resilience_fixtures import build_small_repository
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

from client.connection import connect
from server import ServerOptions, TritonServer
from server.admin import load_model

pytestmark = pytest.mark.integration
MODEL = "trivial"
REFUSED = {"http": "400", "grpc": "StatusCode.INVALID_ARGUMENT"}
HANG_GUARD_S = 90  # not a latency bound: how long a broken front may hold a call


def _answer(server: TritonServer, protocol: str, rows: int) -> tuple[str, str]:
    """How one inference of ``rows`` rows of ``trivial`` was answered: (status, message); served: 200."""
    client = connect(protocol, url(server, protocol))
    timeout: dict[str, Any] = {"client_timeout": HANG_GUARD_S} if protocol == "grpc" else {}
    try:
        client.infer(MODEL, trivial_inputs(protocol, rows), **timeout)
    except InferenceServerException as error:
        return str(error.status()), error.message() or ""
    finally:
        client.close()
    return "200", ""


def _answers(server: TritonServer, rows: int) -> dict[str, tuple[str, str]]:
    return {protocol: _answer(server, protocol, rows) for protocol in PROTOCOLS}


def _front_refusal(rows: int, limit: int) -> dict[str, tuple[str, str]]:
    """The front's own refusal of a batch above ``limit`` (Triton's words would start ``[request id``)."""
    message = (
        f"input 'x' declares a batch of {rows}: inference request batch-size must be <= {limit} for '{MODEL}'"
    )
    return {protocol: (REFUSED[protocol], message) for protocol in PROTOCOLS}


SERVED = {protocol: ("200", "") for protocol in PROTOCOLS}


def _write_max_batch(repository: Path, limit: int) -> None:
    path = repository / MODEL / "config.pbtxt"
    config = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
    config.max_batch_size = limit
    path.write_text(text_format.MessageToString(config))


def _load_again(server: TritonServer) -> None:
    """Load ``trivial`` as ``python -m server load trivial`` does: Triton's own port, the admin key."""
    client = httpclient.InferenceServerClient(server.triton_http_url, network_timeout=HANG_GUARD_S)
    try:
        load_model(client, server.admin_key, MODEL, changes=server.config_changes_file)
    finally:
        client.close()


@pytest.fixture(scope="module")
def reload_server(spec_data: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Any:
    repository = build_small_repository(
        spec_data, tmp_path_factory.mktemp("reload_repository"), pipeline=False
    )
    _write_max_batch(repository, 32)
    options = ServerOptions(
        repository=repository, http_front=True, grpc_front=True, self_heal=False, startup_timeout_s=240,
        exit_timeout_s=3, workdir=tmp_path_factory.mktemp("reload_workdir"),
    )  # fmt: skip
    with TritonServer(options) as server:
        yield server, repository


def test_right_after_a_load_the_fronts_check_against_the_new_config(reload_server: Any) -> None:
    server, repository = reload_server
    _write_max_batch(repository, 32)
    _load_again(server)
    assert _answers(server, 16) == SERVED  # the fronts now hold the config of 32
    _write_max_batch(repository, 8)
    _load_again(server)
    assert _answers(server, 16) == _front_refusal(16, 8)  # never reaches Triton
    assert _answers(server, 8) == SERVED
    _write_max_batch(repository, 32)
    _load_again(server)
    assert _answers(server, 16) == SERVED  # no longer refused by the front


def test_right_after_a_restart_the_fronts_check_against_the_config_on_disk(reload_server: Any) -> None:
    server, repository = reload_server
    _write_max_batch(repository, 8)
    _load_again(server)
    assert _answers(server, 16) == _front_refusal(16, 8)  # the fronts now hold the config of 8
    _write_max_batch(repository, 32)
    os.kill(server.pid, signal.SIGKILL)
    assert server.process is not None
    server.process.wait(timeout=HANG_GUARD_S)
    assert revive(server) is not None  # started again on the same ports, the fronts kept
    assert _answers(server, 16) == SERVED
    assert _answers(server, 40) == _front_refusal(40, 32)
