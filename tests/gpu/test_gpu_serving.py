"""GPU placement for real on a GPU host with the project's ``.venv`` (onnxruntime-gpu's CUDA and TensorRT
providers): ``.venv/bin/python -m pytest -m gpu tests/gpu``; skipped (with the reason) elsewhere. The lent
GPU machine has no onnxruntime-gpu: there ``make gpu-check`` (``gpucheck``) checks KIND_GPU instances on
the torch path instead (docs/GPU.md)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from client.connection import connect
from client.infer import infer
from client.reference import reference
from exporters.artifacts.parity import compare_outputs
from exporters.devices import detect_gpu_count
from exporters.repository import build_repository
from exporters.schema.models import parse_spec
from server import ServerOptions, TritonServer

GPUS = detect_gpu_count()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.integration,
    pytest.mark.skipif(
        GPUS == 0,
        reason="needs an NVIDIA GPU: would check that KIND_GPU instances load on every GPU with the CUDA "
        "(and TensorRT FP16) onnxruntime providers and answer within the precision's tolerance",
    ),
]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gpu_server(spec_data: dict[str, Any], tmp_path_factory: pytest.TempPathFactory):
    data = copy.deepcopy(spec_data)
    for model in data["models"]:
        model["target"] = "gpu"
    repository = tmp_path_factory.mktemp("gpu_repository")
    build_repository(parse_spec(data), repository, num_gpus=GPUS)
    with TritonServer(ServerOptions(repository=repository, startup_timeout_s=600)) as server:
        yield server


@pytest.mark.parametrize("model", ["recommender", "recommender_fp16", "image_classifier"])
def test_gpu_instances_answer_like_torch(gpu_server: TritonServer, model: str) -> None:
    expected = reference(ROOT / "models.yaml", model, batch=8, seed=11)
    client = connect("grpc", gpu_server.grpc_url)
    config = client.get_model_config(model, as_json=True)["config"]
    assert {g["kind"] for g in config["instance_group"]} == {"KIND_GPU"}
    outputs = infer(client, "grpc", model, expected.inputs)
    # TensorRT FP16 (recommender, image_classifier) is held to the fp16 tolerance.
    precision = "fp16" if config.get("optimization") else expected.spec.precision
    names = [t.name for t in expected.spec.outputs]
    compare_outputs(
        [outputs[n] for n in names], [expected.expected[n] for n in names], precision, f"{model} on GPU"
    )
