"""Fault matrix row 74: a config the fronts knew stays in use while Triton does not answer for it.

Triton is stopped (SIGSTOP: it accepts connections and answers nothing, as a starved or hung Triton
does) after the fronts' config of ``trivial`` is due for a refresh. Before, a request for ``trivial``
then waited 5 s on the config fetch and was refused 503 / ``UNAVAILABLE`` "tritonserver is not
reachable", as if Triton were down, for a model whose config the front had a moment ago; the same
happened to a whole burst when a fetch was only slow. Now the request is checked against the known
config and forwarded, and the client gets what Triton's silence is: the model did not answer within
its deadline (504 / ``DEADLINE_EXCEEDED``). Only a model the fronts never saw is refused ``UNAVAILABLE``
while Triton does not answer. Once Triton is dead, the kept config hides nothing: the call upstream
fails, and the client gets the fronts' "not reachable" (or, over HTTP, the 502 of a kept-alive
connection Triton closed), as row 14 says.
"""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from harness import PROTOCOLS, trivial_inputs, url
from process_stop import stop_every_thread
from resilience_fixtures import build_small_repository
from tritonclient.utils import InferenceServerException

from server import ServerOptions, TritonServer
from server.fronts.process import FrontShares
from server.fronts.signature_cache import TTL_S

pytestmark = pytest.mark.integration
DEADLINE_S = 10.0  # the fronts' deadline for a model whose config sets none (trivial's)
HANG_GUARD_S = 90  # not a latency bound: how long a broken front may hold a call


def _answer(server: TritonServer, protocol: str, model: str) -> tuple[str, str]:
    """How the front answered one inference of ``model``: (status, message); ``("200", "")`` served."""
    if protocol == "http":
        client: Any = httpclient.InferenceServerClient(url(server, protocol), network_timeout=HANG_GUARD_S)
        timeout = {}
    else:
        client = grpcclient.InferenceServerClient(url(server, protocol))
        timeout = {"client_timeout": HANG_GUARD_S}
    try:
        client.infer(model, trivial_inputs(protocol), **timeout)
    except InferenceServerException as error:
        return str(error.status()).removeprefix("StatusCode."), error.message() or ""
    finally:
        client.close()
    return "200", ""


@pytest.fixture(scope="module")
def small_repository(spec_data: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_small_repository(spec_data, tmp_path_factory.mktemp("refresh_repository"), pipeline=False)


def test_a_known_config_is_used_while_triton_is_silent_and_a_dead_triton_is_not_hidden(
    small_repository: Path, tmp_path: Path
) -> None:
    options = ServerOptions(
        repository=small_repository, http_front=True, grpc_front=True, self_heal=False,
        startup_timeout_s=240, workdir=tmp_path, front_shares=FrontShares(deadline_s=DEADLINE_S),
    )  # fmt: skip
    calls = [(protocol, model) for protocol in PROTOCOLS for model in ("trivial", "never_asked_for")]
    with TritonServer(options) as server, ThreadPoolExecutor(len(calls)) as pool:
        assert [_answer(server, protocol, "trivial") for protocol in PROTOCOLS] == [("200", "")] * 2
        time.sleep(TTL_S)  # the fronts' configs of trivial are now due for a refresh: not a latency bound
        stop_every_thread(server.pid)
        try:
            silent = dict(zip(calls, pool.map(lambda call: _answer(server, *call), calls), strict=True))
        finally:
            os.kill(server.pid, signal.SIGKILL)
            os.kill(server.pid, signal.SIGCONT)
        assert server.process is not None
        server.process.wait(timeout=HANG_GUARD_S)
        dead = {protocol: _answer(server, protocol, "trivial") for protocol in PROTOCOLS}

    late = f"model 'trivial' did not answer within its deadline of {DEADLINE_S:g} s"
    for protocol, status in (("http", "504"), ("grpc", "DEADLINE_EXCEEDED")):
        code, message = silent[protocol, "trivial"]
        assert (code, message.split(";")[0]) == (status, late), silent
    unchecked = "tritonserver is not reachable (starting, restarting or down), so the config of model "
    for protocol, status in (("http", "503"), ("grpc", "UNAVAILABLE")):
        code, message = silent[protocol, "never_asked_for"]
        assert code == status and message.startswith(unchecked + "'never_asked_for'"), silent
    http_dead = {"503": "tritonserver is not reachable", "502": "tritonserver did not answer"}
    assert dead["http"][1].startswith(http_dead.get(dead["http"][0], "?")), dead
    assert dead["grpc"][0] == "UNAVAILABLE", dead
    assert dead["grpc"][1].startswith("tritonserver is not reachable"), dead
