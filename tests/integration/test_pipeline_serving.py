"""The pipelines of models.yaml served by a real tritonserver: parity with their monolithic models,
concurrent batching across stages, and a failing stage answered with an error naming ensemble and stage.

Besides the shipped pipelines the repository holds a test-only variant: the image classifier cut into
three stages at given cut points, bf16 boundaries, and two replicas of the middle stage (hybrid).
"""

from __future__ import annotations

import copy
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from client.infer import make_inputs
from exporters.inputs import draw_inputs
from exporters.parity import compare_outputs
from exporters.pipeline_build import build_pipelines
from exporters.repository import build_repository
from exporters.sources.load import build_torch_model
from exporters.spec import Spec, parse_spec
from server import ServerOptions, TritonServer

pytestmark = pytest.mark.integration
HYBRID = {
    "name": "image_classifier_pipeline_hybrid", "model": "image_classifier", "split": "blocks",
    "stages": 3, "cut_points": [2, 6], "replicas": [1, 2, 1], "boundary_dtype": "bf16",
}  # fmt: skip


@pytest.fixture(scope="module")
def pipeline_spec(spec_data: dict[str, Any]) -> Spec:
    data = copy.deepcopy(spec_data)
    data["models"] = [m for m in data["models"] if m["name"] in ("recommender", "image_classifier")]
    data["pipelines"] = [*data.get("pipelines", []), HYBRID]
    return parse_spec(data)


@pytest.fixture(scope="module")
def server(pipeline_spec: Spec, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    repository = tmp_path_factory.mktemp("pipeline_repository")
    build_repository(pipeline_spec, repository, num_gpus=0)
    build_pipelines(pipeline_spec, repository, num_gpus=0)
    # About a dozen Python-backend stubs, most importing torch: on a loaded 2-core machine (load 15-22)
    # their start outlasted 240 s; the allowance is for starting, nothing here times the server.
    with TritonServer(ServerOptions(repository=repository, startup_timeout_s=540)) as running:
        yield running


@pytest.fixture()
def client(server: TritonServer) -> Iterator[httpclient.InferenceServerClient]:
    # Closed after each test: an open connection holds up the server's shutdown for its exit timeout.
    connection = httpclient.InferenceServerClient(server.http_url, concurrency=8)
    yield connection
    connection.close()


def _first_output(result: httpclient.InferResult) -> np.ndarray:
    return result.as_numpy(result.get_response()["outputs"][0]["name"])


def infer(client: httpclient.InferenceServerClient, model: str, arrays: dict[str, np.ndarray]) -> np.ndarray:
    """The first output of ``model`` for ``arrays``."""
    return _first_output(client.infer(model, make_inputs(httpclient, arrays)))


def _inputs(spec: Spec, model: str, batch: int, seed: int) -> dict[str, np.ndarray]:
    model_spec = spec.model(model)
    arrays = draw_inputs(model_spec, batch, seed, build_torch_model(model_spec))
    return {t.name: a for t, a in zip(model_spec.inputs, arrays, strict=True)}


def test_every_pipeline_and_stage_is_ready(server: TritonServer, client, pipeline_spec: Spec) -> None:
    for pipeline in pipeline_spec.pipelines:
        for name in pipeline.repository_names:
            assert client.is_model_ready(name), f"{name} not ready"


@pytest.mark.parametrize(
    "pipeline",
    ["recommender_pipeline", "image_classifier_pipeline", "image_classifier_pipeline_fp16", HYBRID["name"]],
)
def test_pipeline_equals_monolithic_model(client, pipeline_spec: Spec, pipeline: str) -> None:
    spec = pipeline_spec.pipeline(pipeline)
    arrays = _inputs(pipeline_spec, spec.model, batch=5, seed=11)
    expected = infer(client, spec.model, arrays)
    actual = infer(client, pipeline, arrays)
    # compare_outputs raises with the numbers outside the boundary dtype's tolerance; and the answers
    # compared are not all alike, so agreeing on them says the models agree.
    compare_outputs([actual], [expected], spec.boundary_dtype, f"{pipeline} vs {spec.model}")
    assert len(np.unique(expected.reshape(5, -1), axis=0)) > 1


@pytest.mark.parametrize("pipeline", ["recommender_pipeline", HYBRID["name"]])
def test_concurrent_requests_get_their_own_answers(client, pipeline_spec: Spec, pipeline: str) -> None:
    """Requests batched together inside each stage are split back to the right caller."""
    spec = pipeline_spec.pipeline(pipeline)
    requests = [_inputs(pipeline_spec, spec.model, batch=1 + i % 3, seed=100 + i) for i in range(16)]
    expected = [infer(client, spec.model, arrays) for arrays in requests]
    pending = [
        client.async_infer(pipeline, make_inputs(httpclient, arrays)) for arrays in requests
    ]  # all in flight
    answers = [_first_output(request.get_result()) for request in pending]
    for index, (answer, reference) in enumerate(zip(answers, expected, strict=True)):
        compare_outputs([answer], [reference], spec.boundary_dtype, f"{pipeline} request {index}")


def test_failing_stage_names_ensemble_and_stage_and_server_keeps_answering(
    client, pipeline_spec: Spec
) -> None:
    arrays = _inputs(pipeline_spec, "recommender", batch=2, seed=3)
    arrays["sparse_ids"][1, 2] = 10**6
    with pytest.raises(InferenceServerException) as raised:
        infer(client, "recommender_pipeline", arrays)
    message = raised.value.message()
    assert raised.value.status() == "400"
    assert "in ensemble 'recommender_pipeline'" in message
    assert "recommender_pipeline_embedding" in message and "sparse_ids" in message
    good = _inputs(pipeline_spec, "recommender", batch=2, seed=4)
    np.testing.assert_allclose(
        infer(client, "recommender_pipeline", good), infer(client, "recommender", good), rtol=1e-5, atol=1e-6
    )


def test_every_stage_ran_for_the_ensemble(client, pipeline_spec: Spec) -> None:
    """Server statistics show each stage executing (what the perf study's per-boundary figures use)."""
    arrays = _inputs(pipeline_spec, "image_classifier", batch=2, seed=5)
    infer(client, HYBRID["name"], arrays)
    for stage in pipeline_spec.pipeline(HYBRID["name"]).stage_names:
        stats = client.get_inference_statistics(stage)["model_stats"][0]
        assert stats["inference_count"] >= 2, f"{stage} did not run"


@pytest.mark.parametrize("pipeline", ["recommender_pipeline", "image_classifier_pipeline_fp16"])
def test_client_cli_checks_a_pipeline_against_its_model(server: TritonServer, pipeline: str) -> None:
    """``python -m client infer --check`` holds a pipeline to the torch model it splits."""
    root = Path(__file__).resolve().parents[2]
    command = [sys.executable, "-m", "client", "--protocol", "grpc", "--url", server.grpc_url]
    result = subprocess.run(
        [*command, "infer", "--model", pipeline, "--check"], capture_output=True, text=True, cwd=root
    )
    assert result.returncode == 0, result.stderr
    assert "match: max abs error" in result.stdout
