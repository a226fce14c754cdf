"""The built repository served by a real tritonserver, queried with tritonclient over HTTP and gRPC."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from batched import GROUP, Batch, sent_as_batches
from bursts import bursts_until_refused
from counted import stats_counting
from raw_json import infer_json
from tritonclient.utils import InferenceServerException

from client.__main__ import main as client_main
from client.connection import connect
from client.infer import infer
from client.reference import reference
from client.stats import model_stats
from exporters.schema.models import Spec
from server import TritonServer

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "models.yaml"
PROTOCOLS = ("http", "grpc")
GROUPED = "recommender_batch_of_four"  # built by conftest.py


def _url(server: TritonServer, protocol: str) -> str:
    return server.http_url if protocol == "http" else server.grpc_url


def test_every_model_is_ready(server: TritonServer, serving_spec: Spec) -> None:
    for protocol in PROTOCOLS:
        client = connect(protocol, _url(server, protocol))
        assert client.is_server_ready()
        for model in serving_spec.models:
            assert client.is_model_ready(model.name), f"{model.name} not ready over {protocol}"


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("use_shm", [False, True], ids=["socket", "system_shm"])
@pytest.mark.parametrize("model", ["recommender", "recommender_fp16", "image_classifier"])
def test_answers_equal_torch(server: TritonServer, protocol: str, use_shm: bool, model: str) -> None:
    expected = reference(SPEC, model, batch=5, seed=7)
    outputs = infer(
        connect(protocol, _url(server, protocol)), protocol, model, expected.inputs, use_shm=use_shm
    )
    expected.compare(outputs, f"{model} over {protocol}")  # raises Mismatch outside the tolerance
    # The comparison is not vacuous: the server did not give every sample the same answer.
    answer = next(iter(outputs.values()))
    assert answer.shape[0] == 5 and len(np.unique(answer.reshape(5, -1), axis=0)) > 1


def test_dynamic_batcher_forms_batches_under_concurrent_load(server: TritonServer) -> None:
    client = connect("grpc", server.grpc_url)
    before = model_stats(client, "grpc", "recommender")
    expected = reference(SPEC, "recommender", batch=1, seed=3)

    def one(_: int) -> np.ndarray:
        own = connect("grpc", server.grpc_url)
        return infer(own, "grpc", "recommender", expected.inputs)["probability"]

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(one, range(320)))
    counted = stats_counting(client, "grpc", "recommender", before, 320)
    inferences, executions = counted.inferences, counted.executions
    assert inferences == 320
    assert executions < inferences, f"no batching: {executions} executions for {inferences} inferences"
    for answer in answers:  # batching must not change anyone's answer
        np.testing.assert_allclose(answer, expected.expected["probability"], rtol=1e-5)


def _recommender_json(dense_type: str = "FP32", rows: int = 1, dense_width: int = 13, ids: int = 1) -> dict:
    return {
        "inputs": [
            {
                "name": "dense",
                "shape": [rows, dense_width],
                "datatype": dense_type,
                "data": [0.5] * rows * dense_width,
            },
            {"name": "sparse_ids", "shape": [rows, 8], "datatype": "INT64", "data": [ids] * rows * 8},
        ]
    }


KSERVE_DATATYPES = {"fp32": "FP32", "fp16": "FP16", "int64": "INT64", "int32": "INT32"}


def test_raw_kserve_json_requests(server: TritonServer, serving_spec: Spec) -> None:
    """A plain KServe v2 JSON body (what curl sends) to every model: outputs of the right shape.

    Triton takes no FP16 in JSON; an fp16 model answers 400 naming the input (tritonclient's binary
    format serves it, see test_answers_equal_torch). The model that holds requests until a group is
    queued gets a whole group in one body, which it runs at once.
    """
    for model in serving_spec.models:
        rows = GROUP if model.name == GROUPED else 2
        body = {
            "inputs": [
                {
                    "name": t.name,
                    "shape": [rows, *t.shape],
                    "datatype": KSERVE_DATATYPES[t.dtype],
                    "data": [0] * rows * int(np.prod(t.shape)),
                }
                for t in model.inputs
            ]
        }
        status, answer = infer_json(server.http_url, model.name, body)
        if model.precision == "fp16":
            assert status == 400 and f"binary data format for input {model.inputs[0].name}" in answer["error"]
            continue
        assert status == 200, (model.name, answer)
        shapes = {o["name"]: o["shape"] for o in answer["outputs"]}
        assert shapes == {t.name: [rows, *t.shape] for t in model.outputs}, model.name


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (_recommender_json(dense_type="FP64"), "'dense'"),
        (_recommender_json(dense_width=12), "'dense'"),
        (_recommender_json(rows=65), "batch-size"),
        (_recommender_json(ids=10**9), "'sparse_ids'"),
    ],
    ids=["wrong_dtype", "wrong_shape", "batch_above_max", "id_out_of_range"],
)
def test_bad_input_gets_400_naming_the_problem(server: TritonServer, body: dict, fragment: str) -> None:
    status, answer = infer_json(server.http_url, "recommender", body)
    assert status == 400, answer
    assert fragment in answer["error"]
    assert (
        infer_json(server.http_url, "recommender", _recommender_json())[0] == 200
    )  # the server still answers


def test_grpc_bad_input_is_invalid_argument(server: TritonServer) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    dense = grpcclient.InferInput("dense", [1, 13], "FP64")
    dense.set_data_from_numpy(np.zeros((1, 13), np.float64))
    ids = grpcclient.InferInput("sparse_ids", [1, 8], "INT64")
    ids.set_data_from_numpy(np.zeros((1, 8), np.int64))
    with pytest.raises(InferenceServerException) as error:
        client.infer("recommender", [dense, ids])
    assert error.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "'dense'" in error.value.message()
    assert client.is_server_live()


def test_bad_request_in_a_batch_fails_alone(server: TritonServer) -> None:
    """Four requests share one batch; the one with an out-of-range id fails, three succeed. The model
    holds requests until four are queued, so they share it however the host schedules the threads
    (Triton's batch_stats confirm it)."""
    client = connect("grpc", server.grpc_url)
    good = reference(SPEC, "recommender", batch=1, seed=5)

    def one(index: int):
        arrays = dict(good.inputs)
        if index == 2:
            arrays["sparse_ids"] = np.full_like(arrays["sparse_ids"], 10**9)
        try:
            return infer(connect("grpc", server.grpc_url), "grpc", GROUPED, arrays)
        except InferenceServerException as error:
            return error

    def four() -> list:
        with ThreadPoolExecutor(GROUP) as pool:
            return list(pool.map(one, range(GROUP)))

    results = sent_as_batches(four, client, "grpc", [Batch(GROUPED, size=GROUP, inferences=GROUP)])
    failed = [r for r in results if isinstance(r, InferenceServerException)]
    assert len(failed) == 1 and failed[0].status() == "StatusCode.INVALID_ARGUMENT", results
    assert "'sparse_ids'" in failed[0].message()
    for result in (r for r in results if not isinstance(r, InferenceServerException)):
        np.testing.assert_allclose(result["probability"], good.expected["probability"], rtol=1e-5)


def test_overload_is_rejected_by_the_queue_policy(server: TritonServer) -> None:
    """A burst larger than max_queue_size: the excess is rejected at once; sent = ok + rejected. A burst
    that arrives slowly enough to find room is sent again (``bursts_until_refused``)."""
    expected = reference(SPEC, "recommender", batch=1, seed=2)

    def one(_: int) -> str:
        client = connect("http", server.http_url)
        try:
            infer(client, "http", "recommender_tiny_queue", expected.inputs)
            return "ok"
        except InferenceServerException as error:
            return "rejected" if "queue" in error.message().lower() else f"other: {error}"
        finally:
            client.close()  # in this thread: the gevent pool cannot be joined from the collector's

    with ThreadPoolExecutor(24) as pool:
        outcomes = bursts_until_refused(one, pool, 48)
    assert outcomes.count("ok") + outcomes.count("rejected") == len(outcomes), outcomes
    assert outcomes.count("rejected") > 0 and outcomes.count("ok") > 0
    assert httpclient.InferenceServerClient(server.http_url).is_server_live()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_client_cli_check(
    server: TritonServer, protocol: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``client infer --check`` passes on the right weights and catches other ones; ``python -m client``
    is the command users run (the checks run in this process: the reference would import torch again)."""
    command = ["--protocol", protocol, "--url", _url(server, protocol)]
    check = [*command, "infer", "--model", "recommender", "--check", "--spec"]
    assert client_main([*check, str(SPEC)]) == 0
    assert "match: max abs error" in capsys.readouterr().out
    wrong_spec = tmp_path / "models.yaml"  # same model name, other weights: the check must catch it
    wrong_spec.write_text(SPEC.read_text().replace("seed: 0", "seed: 1", 1))
    assert client_main([*check, str(wrong_spec)]) == 1
    assert "MISMATCH" in capsys.readouterr().err
    stats = subprocess.run(
        [sys.executable, "-m", "client", *command, "stats", "--model", "recommender"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert stats.returncode == 0 and "executions (mean batch" in stats.stdout
