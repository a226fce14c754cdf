"""Own models as real exporters write them, from ``exporters init`` through ``make serve`` (the real
``python -m server start``) and ``client infer --check``, each command run as a user runs it, in a
project folder of its own (its own ``.run/``), on free ports:

* an ONNX file shaped like paddle2onnx's (``x:0`` in, ``save_infer_model/scale_0.tmp_1`` out, ``?``
  for batch, height and width) and a factory with a sampler: both serve and answer like their source;
  a request longer than the input's ``max_shape`` gets 400 / INVALID_ARGUMENT naming the input; a
  second server in the same checkout is refused in one line naming the one that holds it;
* the factory's spec with a wrong input dtype: the build stops with one line naming the field;
* a repository where one model fails to load: ``start`` exits 1 naming it, and stops the server;
  ``--allow-partial`` serves the others.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import yaml
from tritonclient.utils import InferenceServerException

from server.admin import FRONT_HEADER, GRPC_FRONT_HEADER
from tests.faults.harness import start_arguments

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "real_exporters"
sys.path.insert(0, str(DATA))
from exported_files import INPUT, paddle_like  # noqa: E402

MODELS = ("paddle_cls", "own_classifier")
MAX_LENGTH = 64
COMMAND_TIMEOUT_S = 600  # a hang guard for one command on a busy machine, not a bound


def _run(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m <args>`` in ``folder``, importing this tree's code."""
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=folder, env=environment, capture_output=True, text=True,
        timeout=COMMAND_TIMEOUT_S,
    )  # fmt: skip


def _init(folder: Path, *args: str) -> list[dict]:
    done = _run(folder, "exporters", "init", "--max-batch-size", "4", *args)
    assert done.returncode == 0, done.stdout + done.stderr
    return yaml.safe_load(done.stdout)["models"]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's folder: the ONNX file, ``models.yaml`` from ``exporters init``, the built repository."""
    folder = tmp_path_factory.mktemp("real_exporters")
    paddle_like(folder / "inference.onnx")
    models = _init(
        folder, "--onnx", "inference.onnx", "--name", "paddle_cls", "--max-length", str(MAX_LENGTH)
    )
    models += _init(
        folder, "--python", "own_nets:classifier", "--path", str(DATA), "--sample", "own_nets:sample",
        "--name", "own_classifier",
    )  # fmt: skip
    assert models[0]["inputs"][0]["name"] == INPUT and models[0]["inputs"][0]["shape"] == [3, -1, -1]
    (folder / "models.yaml").write_text(yaml.safe_dump({"models": models}, sort_keys=False))
    built = _run(folder, "exporters", "build", "--spec", "models.yaml", "--repository", "model_repository")
    assert built.returncode == 0, built.stdout + built.stderr
    return folder


def _check(folder: Path, model: str, protocol: str) -> None:
    done = _run(
        folder, "client", "--protocol", protocol, "infer", "--model", model, "--spec", "models.yaml",
        "--batch", "3", "--check",
    )  # fmt: skip
    assert done.returncode == 0 and "match: max abs error" in done.stdout, done.stdout + done.stderr


def _too_long_over_http(http_url: str, headers: dict[str, str]) -> tuple[int, str]:
    shape = [1, 3, MAX_LENGTH + 1, 8]
    body = {
        "inputs": [{"name": INPUT, "shape": shape, "datatype": "FP32", "data": [0.0] * int(np.prod(shape))}]
    }
    request = urllib.request.Request(
        f"http://{http_url}/v2/models/paddle_cls/infer", json.dumps(body).encode(),
        {"Content-Type": "application/json", **headers},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_real_exporter_files_serve_and_answer_like_their_source(project: Path) -> None:
    started = _run(project, "server", "start", *start_arguments())
    assert started.returncode == 0 and "tritonserver ready" in started.stdout, started.stdout + started.stderr
    try:
        state = json.loads((project / ".run" / "server.json").read_text())
        for model in MODELS:
            for protocol in ("http", "grpc"):
                _check(project, model, protocol)

        # the fronts, and Triton's own ports behind them (as the fronts pass requests on): the backend
        key = (project / ".run" / "admin.key").read_text().strip()
        for http_url, headers in ((state["http"], {}), (state["triton_http"], {FRONT_HEADER: key})):
            status, text = _too_long_over_http(http_url, headers)
            assert status == 400 and f"input '{INPUT}'" in text and "max_shape" in text, (
                http_url,
                status,
                text,
            )
        image = grpcclient.InferInput(INPUT, [1, 3, MAX_LENGTH + 1, 8], "FP32")
        image.set_data_from_numpy(np.zeros((1, 3, MAX_LENGTH + 1, 8), np.float32))
        for grpc_url, headers in ((state["grpc"], {}), (state["triton_grpc"], {GRPC_FRONT_HEADER: key})):
            with pytest.raises(InferenceServerException) as refused:
                grpcclient.InferenceServerClient(grpc_url).infer("paddle_cls", [image], headers=headers)
            assert refused.value.status() == "StatusCode.INVALID_ARGUMENT", (grpc_url, refused.value)
            assert INPUT in refused.value.message() and "max_shape" in refused.value.message()

        second = _run(project, "server", "start", *start_arguments())
        line = second.stderr.strip()
        assert second.returncode == 1 and "\n" not in line, second.stderr
        assert f"tritonserver pid {state['pid']}" in line and state["http"] in line and "`make stop`" in line
        _check(project, "paddle_cls", "http")  # the first server is untouched
    finally:
        stopped = _run(project, "server", "stop")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr


def test_a_wrong_dtype_in_a_factory_spec_stops_the_build_in_one_line(project: Path) -> None:
    models = yaml.safe_load((project / "models.yaml").read_text())["models"]
    own = next(m for m in models if m["name"] == "own_classifier")
    own = {**own, "sample": None, "inputs": [{**own["inputs"][0], "dtype": "int64", "range": [0, 10]}]}
    (project / "wrong.yaml").write_text(yaml.safe_dump({"models": [own]}, sort_keys=False))
    built = _run(project, "exporters", "build", "--spec", "wrong.yaml", "--repository", "wrong_repository")
    said = (built.stdout + built.stderr).strip()
    assert built.returncode != 0 and "Traceback" not in said, said
    assert said.startswith("spec error own_classifier.inputs[0].dtype: the model's forward fails"), said
    assert len(said.splitlines()) == 1 and "give each input the dtype" in said


def test_serve_exits_1_naming_each_model_that_failed_unless_partial_is_allowed(
    project: Path, tmp_path: Path
) -> None:
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    shutil.copy(project / "models.yaml", checkout / "models.yaml")
    shutil.copy(project / "inference.onnx", checkout / "inference.onnx")
    shutil.copytree(project / "model_repository", checkout / "model_repository")
    (checkout / "model_repository" / "paddle_cls" / "1" / "model.onnx").write_bytes(b"not an ONNX file")

    refused = _run(checkout, "server", "start", *start_arguments())
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "1 model(s) failed to load: paddle_cls" in refused.stderr and "ALLOW_PARTIAL=1" in refused.stderr
    assert (
        "model 'paddle_cls' failed to load" in refused.stderr and "tritonserver ready" not in refused.stdout
    )
    assert not (checkout / ".run" / "server.json").exists()  # stopped: nothing left serving

    partial = _run(checkout, "server", "start", "--allow-partial", *start_arguments())
    try:
        assert partial.returncode == 0, partial.stdout + partial.stderr
        assert "1 model(s) failed to load; the others serve" in partial.stderr
        _check(checkout, "own_classifier", "grpc")
    finally:
        stopped = _run(checkout, "server", "stop")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
