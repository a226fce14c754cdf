"""Configs are built through the protobuf schema: every section written, parsed back and compared."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2

from exporters.configs.model_config import (
    EnsembleStep,
    InstanceGroup,
    ModelConfig,
    ModelDynamicBatching,
    ModelTensor,
    read_config,
    write_config,
)
from exporters.configs.models import WARMUP_PARAMETER, build_model_config
from exporters.errors import SpecError


def _round_trip(config: ModelConfig, tmp_path: Path) -> model_config_pb2.ModelConfig:
    parsed = read_config(write_config(config, tmp_path / config.name))
    assert parsed == config.to_proto()
    return parsed


def test_dynamic_batching_section(model_spec, tmp_path: Path) -> None:
    parsed = _round_trip(build_model_config(model_spec("image_classifier"), num_gpus=0), tmp_path)
    assert parsed.max_batch_size == 32
    assert list(parsed.dynamic_batching.preferred_batch_size) == [8, 16, 32]
    assert parsed.dynamic_batching.max_queue_delay_microseconds == 10_000
    policy = parsed.dynamic_batching.default_queue_policy
    assert policy.max_queue_size == 256
    assert policy.default_timeout_microseconds == 2_000_000
    assert policy.timeout_action == model_config_pb2.ModelQueuePolicy.REJECT


def test_static_batching_has_no_batcher_and_warms_the_fixed_size(model_spec, tmp_path: Path) -> None:
    spec = model_spec("recommender", batching={"mode": "static", "batch_size": 32})
    parsed = _round_trip(build_model_config(spec, num_gpus=0), tmp_path)
    assert not parsed.HasField("dynamic_batching")
    assert [w.batch_size for w in parsed.model_warmup] == [32]


def test_cpu_target_gets_one_cpu_group(model_spec, tmp_path: Path) -> None:
    spec = model_spec("recommender", instances={"cpu": 3})
    parsed = _round_trip(build_model_config(spec, num_gpus=0), tmp_path)
    assert [(g.kind, g.count, list(g.gpus)) for g in parsed.instance_group] == [
        (model_config_pb2.ModelInstanceGroup.KIND_CPU, 3, [])
    ]
    assert not parsed.optimization.execution_accelerators.gpu_execution_accelerator


def test_four_gpus_two_instances_each_as_text(model_spec, tmp_path: Path) -> None:
    spec = model_spec("image_classifier", instances={"per_gpu": 2, "gpus": "all"})
    path = write_config(build_model_config(spec, num_gpus=4), tmp_path / "image_classifier")
    text = path.read_text()
    for gpu in range(4):
        assert f"instance_group {{\n  count: 2\n  gpus: {gpu}\n  kind: KIND_GPU\n}}" in text
    parsed = read_config(path)
    assert [list(g.gpus) for g in parsed.instance_group] == [[0], [1], [2], [3]]
    accelerator = parsed.optimization.execution_accelerators.gpu_execution_accelerator[0]
    assert accelerator.name == "tensorrt" and accelerator.parameters["precision_mode"] == "FP16"


def test_selected_gpus_and_missing_gpu(model_spec) -> None:
    spec = model_spec("recommender", instances={"per_gpu": 1, "gpus": [1, 3]})
    config = build_model_config(spec, num_gpus=4)
    assert [g.gpus for g in config.instance_group] == [[1], [3]]
    with pytest.raises(SpecError, match=r"recommender.instances.gpus: GPU 3 does not exist"):
        build_model_config(spec, num_gpus=2)
    with pytest.raises(SpecError, match=r"recommender.target: is gpu but no GPU"):
        build_model_config(model_spec("recommender", target="gpu"), num_gpus=0)


def test_warmup_uses_zeros_for_every_input(model_spec, tmp_path: Path) -> None:
    parsed = _round_trip(build_model_config(model_spec("recommender"), num_gpus=0), tmp_path)
    # batch 1 only, a size every max_batch_size allows; the backend warms the larger sizes it forms
    assert [w.batch_size for w in parsed.model_warmup] == [1]
    assert parsed.parameters[WARMUP_PARAMETER].string_value == "true"
    inputs = parsed.model_warmup[0].inputs
    assert inputs["sparse_ids"].zero_data and not inputs["sparse_ids"].random_data
    assert inputs["dense"].zero_data and not inputs["dense"].random_data
    assert list(inputs["dense"].dims) == [13]


def test_thread_parameters(model_spec, tmp_path: Path) -> None:
    spec = model_spec("recommender", threads={"intra_op": 2, "inter_op": 1})
    parsed = _round_trip(build_model_config(spec, num_gpus=0), tmp_path)
    assert parsed.parameters["intra_op_thread_count"].string_value == "2"
    assert parsed.parameters["inter_op_thread_count"].string_value == "1"
    assert parsed.backend == "onnxruntime"


def test_ensemble_section_round_trips(tmp_path: Path) -> None:
    config = ModelConfig(
        name="pipe",
        platform="ensemble",
        max_batch_size=8,
        input=[ModelTensor("x", "TYPE_FP32", [4])],
        output=[ModelTensor("y", "TYPE_FP32", [4])],
        ensemble_steps=[
            EnsembleStep("a", input_map={"x": "x"}, output_map={"h": "mid"}),
            EnsembleStep("b", input_map={"h": "mid"}, output_map={"y": "y"}),
        ],
    )
    parsed = _round_trip(config, tmp_path)
    assert [s.model_name for s in parsed.ensemble_scheduling.step] == ["a", "b"]


@pytest.mark.parametrize(
    ("make_kwargs", "message"),
    [
        (
            lambda: {"dynamic_batching": ModelDynamicBatching(preferred_batch_size=[16])},
            "preferred_batch_size",
        ),
        (
            lambda: {"dynamic_batching": ModelDynamicBatching(max_queue_delay_microseconds=-1)},
            "max_queue_delay",
        ),
        (
            lambda: {"instance_group": [InstanceGroup("KIND_CPU", 1, gpus=[0])]},
            "KIND_CPU instances cannot name",
        ),
        (lambda: {"instance_group": [InstanceGroup("KIND_TPU")]}, "unknown kind"),
        (lambda: {"max_batch_size": -1}, "max_batch_size"),
        (lambda: {"backend": ""}, "exactly one of backend and platform"),
    ],
)
def test_invalid_configs_name_the_field(make_kwargs, message: str) -> None:
    base = {
        "name": "m",
        "backend": "onnxruntime",
        "max_batch_size": 8,
        "input": [ModelTensor("x", "TYPE_FP32", [4])],
        "output": [ModelTensor("y", "TYPE_FP32", [4])],
    }
    with pytest.raises(SpecError, match=message):
        ModelConfig(**{**base, **make_kwargs()})


def test_unknown_data_type_fails_at_build_time() -> None:
    with pytest.raises(SpecError, match=r"x.data_type"):
        ModelTensor("x", "TYPE_FLOAT32", [4])


def test_to_dict_is_schema_json(model_spec) -> None:
    config = build_model_config(model_spec("recommender"), num_gpus=2)
    message = config.to_proto()
    assert json_format.MessageToDict(message, preserving_proto_field_name=True)["name"] == "recommender"
