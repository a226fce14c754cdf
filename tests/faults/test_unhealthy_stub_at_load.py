"""Fault matrix row 64: a model that failed to load because Triton found its stub unhealthy is loaded
again.

On a starved machine a sound stub can miss Triton 2.51's health check while it starts or runs its
warm-up; the model then fails to load with ``Stub process '<instance>' is not healthy`` and a server
start named it failed though nothing was wrong with it. That starvation cannot be made on demand (a
stub stopped or exited in its warm-up segfaults 2.51 instead), so the models here fail their first
loads with Triton's words: the launcher must load such a model again, serve it once a load succeeds,
name one that fails ``START_ATTEMPTS`` loads, and name any other failure after one load.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from python_models import write_x_to_y_model
from resilience_fixtures import explicit_options

from server import TritonServer
from server.launcher import START_ATTEMPTS, starved_stub_load

pytestmark = pytest.mark.integration
MODEL_PY = """
from pathlib import Path

LOADS = Path({loads!r})  # one line per load
FAILS_UNTIL = {fails_until}  # loads up to this one fail
REASON = {reason!r}


class TritonPythonModel:
    def initialize(self, args):
        with LOADS.open("a") as log:
            log.write("load\\n")
        if len(LOADS.read_text().splitlines()) <= FAILS_UNTIL:
            raise RuntimeError(REASON.format(instance=args["model_instance_name"]))

    def execute(self, requests):
        import triton_python_backend_utils as pb_utils

        x = pb_utils.get_input_tensor_by_name(requests[0], "x").as_numpy()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", 2 * x)])]
"""
UNHEALTHY = "failed to run warmup sample 'batch_1': Stub process '{instance}' is not healthy."
BROKEN = "this model's initialize is broken"


def _write_model(repository: Path, name: str, loads: Path, fails_until: int, reason: str = UNHEALTHY) -> None:
    write_x_to_y_model(
        repository, name, MODEL_PY.format(loads=str(loads), fails_until=fails_until, reason=reason)
    )


def test_a_model_whose_stub_was_unhealthy_is_loaded_again_and_only_lasting_failures_are_named(
    tmp_path: Path,
) -> None:
    repository = tmp_path / "repository"
    loads = {name: tmp_path / f"{name}.log" for name in ("unhealthy_once", "unhealthy_always", "broken")}
    _write_model(repository, "unhealthy_once", loads["unhealthy_once"], fails_until=1)
    _write_model(repository, "unhealthy_always", loads["unhealthy_always"], fails_until=1_000)
    _write_model(repository, "broken", loads["broken"], fails_until=1_000, reason=BROKEN)
    with TritonServer(explicit_options(repository, tmp_path / "workdir")) as server:
        assert set(server.failed_models) == {"unhealthy_always", "broken"}, server.describe_failures()
        assert starved_stub_load(server.failed_models["unhealthy_always"])
        assert BROKEN in server.failed_models["broken"]
        counted = {name: len(path.read_text().splitlines()) for name, path in loads.items()}
        assert counted == {"unhealthy_once": 2, "unhealthy_always": START_ATTEMPTS, "broken": 1}
        client = httpclient.InferenceServerClient(server.http_url)
        x = httpclient.InferInput("x", [4], "FP32")
        x.set_data_from_numpy(np.arange(4, dtype=np.float32))
        assert client.infer("unhealthy_once", [x]).as_numpy("y").tolist() == [0.0, 2.0, 4.0, 6.0]
