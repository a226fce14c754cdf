"""Fault matrix row: a stub that runs but never answers.

A Python-backend model whose ``execute`` never returns for one request (here: a test model that sleeps
for an hour on a negative input, as a deadlock or a call that waits forever would): its process and
its health thread look fine, Triton 2.51 reports the model READY and queues every later request behind
it, for good. The watchdog must see requests waiting while nothing finishes (Triton's metrics), kill the
stub, and reload the model: the stuck request and those queued behind it come back with an error
instead of never, the model serves again, another model never fails, and the server stays up.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from harness import orphans
from python_models import write_x_to_y_model
from resilience_fixtures import (
    HANG_GUARD_S,
    MixedLoad,
    build_small_repository,
    client_health,
    explicit_options,
    wait_for,
)
from tritonclient.utils import InferenceServerException

from server import TritonServer

pytestmark = pytest.mark.integration
HANGS = "hangs_on_negative"
MODEL_PY = '''
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

STUCK = Path({stuck!r})  # touched as the stub begins to hang: the test queues requests behind it


class TritonPythonModel:
    """Answers 2x; never returns for a request with a negative element (a stand-in for a deadlock)."""

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            if (x < 0).any():
                STUCK.touch()
                time.sleep(3600)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", (2 * x).astype(np.float32))]))
        return responses
'''


@pytest.fixture(scope="module")
def stuck(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The file the model touches as it begins to hang."""
    return tmp_path_factory.mktemp("stuck") / "stuck"


@pytest.fixture(scope="module")
def server(
    spec_data: dict[str, Any], stuck: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TritonServer]:
    repository = build_small_repository(
        spec_data, tmp_path_factory.mktemp("stuck_repository"), pipeline=False
    )
    write_x_to_y_model(repository, HANGS, MODEL_PY.format(stuck=str(stuck)))
    with TritonServer(explicit_options(repository, tmp_path_factory.mktemp("stuck_workdir"))) as running:
        assert running.failed_models == {}, running.describe_failures()
        yield running


def _infer(server: TritonServer, value: float) -> str:
    """One request to the hanging model: "" for the right answer, else the error."""
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=HANG_GUARD_S)
    tensor = httpclient.InferInput("x", [4], "FP32")
    tensor.set_data_from_numpy(np.full(4, value, np.float32))
    try:
        answer = client.infer(HANGS, [tensor]).as_numpy("y")
    except InferenceServerException as error:
        return error.message()
    return "" if np.array_equal(answer, np.full(4, 2 * value, np.float32)) else f"wrong answer {answer}"


def _still_sending(sender: threading.Thread, outcomes: dict[str, str]) -> None:
    assert sender.is_alive(), f"the request meant to hang was answered: {outcomes}"


def test_a_stub_stuck_in_execute_is_killed_and_its_model_reloaded(server: TritonServer, stuck: Path) -> None:
    assert _infer(server, 1.0) == ""
    outcomes: dict[str, str] = {}

    def send(name: str, value: float) -> None:
        outcomes[name] = _infer(server, value)

    load = MixedLoad(server.http_url, server.grpc_url, ["trivial"]).start()
    try:
        load.wait_for(20)
        senders = [threading.Thread(target=send, args=("stuck", -1.0))]
        senders[0].start()
        # the others only once the stub hangs: sent before, one could run first and be answered, and
        # with nothing waiting behind the hang the watchdog would have nothing to judge
        wait_for(stuck.exists, "the stub to begin its hang", lambda: _still_sending(senders[0], outcomes))
        senders += [threading.Thread(target=send, args=(f"queued {n}", 1.0)) for n in range(3)]
        for sender in senders[1:]:
            sender.start()
        for sender in senders:
            sender.join(timeout=HANG_GUARD_S)
        assert not any(sender.is_alive() for sender in senders), "a request never came back"
        assert _infer(server, 3.0) == "", "the model does not serve again"
        load.wait_for(len(load.ok()) + 20)
    finally:
        load.stop()
    unhealthy = f"Stub process '{HANGS}_0_0' is not healthy."
    assert all(unhealthy in error for error in outcomes.values()), outcomes
    assert not any(o.error for o in load.outcomes), {o.error for o in load.outcomes if o.error}
    assert server.process is not None and server.process.poll() is None, server.log_tail()
    code, text = client_health(server)
    assert code == 0, text
    assert f"watchdog: stub of {HANGS}_0_0 (pid " in text, text
    assert "requests waited" in text and "none finished), killed at" in text, text
    assert not orphans(server), orphans(server)
