"""The pipelines of models.yaml served by a real tritonserver: parity with their monolithic models,
concurrent batching across stages, and a failing stage answered with an error naming ensemble and stage.

The server is the shared one (``conftest.py``). Besides the shipped pipelines it serves a test-only
variant: the image classifier cut into three stages at given cut points, bf16 boundaries, and two
replicas of the middle stage (hybrid).
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from batched import GROUP, Batch, sent_as_batches
from counted import stats_counting
from tritonclient.utils import InferenceServerException

from client.__main__ import main as client_main
from client.infer import make_inputs
from client.stats import model_stats
from exporters.artifacts.parity import compare_outputs
from exporters.schema.models import Spec
from exporters.sources.inputs import draw_inputs
from exporters.sources.load import build_torch_model
from server import TritonServer

pytestmark = pytest.mark.integration
HYBRID = "image_classifier_pipeline_hybrid"  # built by conftest.py
SPEC = Path(__file__).resolve().parents[2] / "models.yaml"


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


def _all_in_flight(
    client: httpclient.InferenceServerClient, model: str, requests: list[dict[str, np.ndarray]]
) -> list[np.ndarray]:
    """The first output of ``model`` for each of ``requests``, all sent before any answer is read."""
    pending = [client.async_infer(model, make_inputs(httpclient, arrays)) for arrays in requests]
    return [_first_output(request.get_result()) for request in pending]


def _inputs(spec: Spec, model: str, batch: int, seed: int) -> dict[str, np.ndarray]:
    model_spec = spec.model(model)
    arrays = draw_inputs(model_spec, batch, seed, build_torch_model(model_spec))
    return {t.name: a for t, a in zip(model_spec.inputs, arrays, strict=True)}


def test_every_pipeline_and_stage_is_ready(server: TritonServer, client, serving_spec: Spec) -> None:
    for pipeline in serving_spec.pipelines:
        for name in pipeline.repository_names:
            assert client.is_model_ready(name), f"{name} not ready"


@pytest.mark.parametrize(
    "pipeline",
    ["recommender_pipeline", "image_classifier_pipeline", "image_classifier_pipeline_fp16", HYBRID],
)
def test_pipeline_equals_monolithic_model(client, serving_spec: Spec, pipeline: str) -> None:
    spec = serving_spec.pipeline(pipeline)
    arrays = _inputs(serving_spec, spec.model, batch=5, seed=11)
    expected = infer(client, spec.model, arrays)
    actual = infer(client, pipeline, arrays)
    # compare_outputs raises with the numbers outside the boundary dtype's tolerance; and the answers
    # compared are not all alike, so agreeing on them says the models agree.
    compare_outputs([actual], [expected], spec.boundary_dtype, f"{pipeline} vs {spec.model}")
    assert len(np.unique(expected.reshape(5, -1), axis=0)) > 1


# The request sizes of each group add up to GROUP: the held first stage (``batched.py``) runs a group as
# one batch of GROUP rows once all of it is queued (no part of a group reaches GROUP before its last
# request), and as no request has GROUP rows, that batch carries two requests or more.
GROUPS = ((1, 3), (2, 2), (1, 1, 2), (1, 1, 1, 1), (3, 1), (1, 2, 1))


@pytest.mark.parametrize("pipeline", ["recommender_pipeline", HYBRID])
def test_concurrent_requests_get_their_own_answers(client, serving_spec: Spec, pipeline: str) -> None:
    """Requests batched together inside a stage are split back to the right caller. Each group is sent
    concurrently to the pipeline's ``_batch_of_four`` variant, whose first stage holds requests until
    the whole group is queued, so the group shares that stage's batch however the host schedules the
    requests (Triton's batch_stats confirm it); later stages get the batch's requests as one burst."""
    held = serving_spec.pipeline(f"{pipeline}_batch_of_four")
    first_stage = Batch(held.stage_names[0], size=GROUP, inferences=GROUP)
    for group_index, group in enumerate(GROUPS):
        requests = [
            _inputs(serving_spec, held.model, rows, seed=100 + 10 * group_index + i)
            for i, rows in enumerate(group)
        ]
        expected = [infer(client, held.model, arrays) for arrays in requests]
        answers = sent_as_batches(
            partial(_all_in_flight, client, held.name, requests), client, "http", [first_stage]
        )
        for index, (answer, reference) in enumerate(zip(answers, expected, strict=True)):
            what = f"{held.name} group {group} request {index}"
            compare_outputs([answer], [reference], held.boundary_dtype, what)


def test_failing_stage_names_ensemble_and_stage_and_server_keeps_answering(
    client, serving_spec: Spec
) -> None:
    arrays = _inputs(serving_spec, "recommender", batch=2, seed=3)
    arrays["sparse_ids"][1, 2] = 10**6
    with pytest.raises(InferenceServerException) as raised:
        infer(client, "recommender_pipeline", arrays)
    message = raised.value.message()
    assert raised.value.status() == "400"
    assert "in ensemble 'recommender_pipeline'" in message
    assert "recommender_pipeline_embedding" in message and "sparse_ids" in message
    good = _inputs(serving_spec, "recommender", batch=2, seed=4)
    np.testing.assert_allclose(
        infer(client, "recommender_pipeline", good), infer(client, "recommender", good), rtol=1e-5, atol=1e-6
    )


def test_every_stage_ran_for_the_ensemble(client, serving_spec: Spec) -> None:
    """Server statistics show each stage executing (what the perf study's per-boundary figures use)."""
    arrays = _inputs(serving_spec, "image_classifier", batch=2, seed=5)
    stages = serving_spec.pipeline(HYBRID).stage_names
    before = {stage: model_stats(client, "http", stage) for stage in stages}
    infer(client, HYBRID, arrays)
    for stage in stages:
        assert stats_counting(client, "http", stage, before[stage], 2).inferences == 2, f"{stage} did not run"


@pytest.mark.parametrize("pipeline", ["recommender_pipeline", "image_classifier_pipeline_fp16"])
def test_client_cli_checks_a_pipeline_against_its_model(
    server: TritonServer, pipeline: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python -m client infer --check`` holds a pipeline to the torch model it splits."""
    command = ["--protocol", "grpc", "--url", server.grpc_url, "infer", "--model", pipeline]
    command += ["--spec", str(SPEC), "--check"]
    assert client_main(command) == 0, capsys.readouterr().err
    assert "match: max abs error" in capsys.readouterr().out
