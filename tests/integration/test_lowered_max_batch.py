"""A built ``config.pbtxt`` whose ``max_batch_size`` is lowered afterwards (by a person, or by a tool
such as Model Analyzer) still loads on the real server, and serves at the new maximum.

The config's own warm-up is at batch 1, a size every ``max_batch_size`` allows; the onnxruntime
backend warms the sizes the loaded config forms. A warm-up sample above the new maximum (what the
exporters wrote before: one at the spec's ``max_batch_size``) fails the load."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

from exporters.repository import build_repository
from exporters.resolve import load_spec
from exporters.schema.models import Spec
from perf.measure.target import target_from_spec
from server import ServerOptions, TritonServer

pytestmark = pytest.mark.integration
SPEC = Path(__file__).resolve().parents[2] / "models.yaml"
MODEL = "recommender"
LOWERED = 4


def _request(model, rows: int) -> list[httpclient.InferInput]:
    inputs = []
    for name, array in target_from_spec(model, "unused", rows=rows).inputs.items():
        tensor = httpclient.InferInput(
            name, list(array.shape), "FP32" if array.dtype == np.float32 else "INT64"
        )
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def test_a_config_lowered_by_hand_loads_and_serves_at_its_new_maximum(tmp_path: Path) -> None:
    model = load_spec(SPEC).model(MODEL)
    assert model.warmup and model.max_batch_size > LOWERED  # the spec warms up, above the new maximum
    repository = tmp_path / "repository"
    build_repository(Spec(models=(model,)), repository, num_gpus=0, only=[MODEL])
    path = repository / MODEL / "config.pbtxt"
    config = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
    config.max_batch_size = LOWERED  # the one edit: nothing else in the file changes
    path.write_text(text_format.MessageToString(config))
    options = ServerOptions(repository=repository, log_path=tmp_path / "server.log", startup_timeout_s=240)
    with TritonServer(options) as server:
        assert server.failed_models == {}, server.failed_models
        client = httpclient.InferenceServerClient(server.http_url)
        try:
            assert client.is_model_ready(MODEL)
            served = client.get_model_config(MODEL)
            assert served["max_batch_size"] == LOWERED
            result = client.infer(MODEL, _request(model, LOWERED))
            assert result.as_numpy(model.outputs[0].name).shape[0] == LOWERED
            with pytest.raises(InferenceServerException, match=rf"batch.size must be <= {LOWERED}"):
                client.infer(MODEL, _request(model, LOWERED + 1))
            assert client.is_server_live()
        finally:
            client.close()
