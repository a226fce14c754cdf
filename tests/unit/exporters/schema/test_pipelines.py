"""The ``pipelines`` section of models.yaml: strict parsing, errors that name the field path."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from exporters.errors import SpecError
from exporters.schema.models import parse_spec


def _with_pipeline(spec_data: dict[str, Any], **fields: Any) -> dict[str, Any]:
    data = copy.deepcopy(spec_data)
    data["pipelines"] = [{"name": "p", "model": "image_classifier", "split": "blocks", **fields}]
    return data


def test_shipped_pipelines_parse(spec_data: dict[str, Any]) -> None:
    spec = parse_spec(spec_data)
    names = [p.name for p in spec.pipelines]
    assert {"recommender_pipeline", "image_classifier_pipeline"} <= set(names)
    recommender = spec.pipeline("recommender_pipeline")
    assert recommender.stage_names == ("recommender_pipeline_embedding", "recommender_pipeline_dense")
    assert recommender.live_updates and recommender.batching == spec.model("recommender").batching


def test_defaults(spec_data: dict[str, Any]) -> None:
    pipeline = parse_spec(_with_pipeline(spec_data)).pipeline("p")
    assert (pipeline.stages, pipeline.balance, pipeline.boundary_dtype) == (2, "latency", "fp32")
    assert pipeline.stage_names == ("p_stage0", "p_stage1") and pipeline.stage_replicas(1) == 1


def test_stages_batch_dynamically_even_when_the_model_does_not(spec_data: dict[str, Any]) -> None:
    data = _with_pipeline(spec_data)
    next(m for m in data["models"] if m["name"] == "image_classifier")["batching"] = {"mode": "none"}
    batching = parse_spec(data).pipeline("p").batching
    assert (batching.mode, batching.max_queue_delay_us) == ("dynamic", 100)


def test_cut_points_imply_the_stage_count(spec_data: dict[str, Any]) -> None:
    assert parse_spec(_with_pipeline(spec_data, cut_points=[2, 5])).pipeline("p").stages == 3


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"model": "nope"}, r"pipelines\[0\]\.model: must name an entry of models"),
        ({"model": ["image_classifier"]}, r"pipelines\[0\]\.model: must name an entry of models"),
        ({"model": "recommender_fp16"}, r"pipelines\[0\]\.model: pipelines split fp32 models"),
        ({"split": "layers"}, r"pipelines\[0\]\.split: must be one of"),
        ({"split": "embedding_dense"}, r"pipelines\[0\]\.split: embedding_dense needs a recommender"),
        ({"stages": 0}, r"pipelines\[0\]\.stages: must be >= 1"),
        ({"stages": 3, "cut_points": [4]}, r"pipelines\[0\]\.cut_points: must be 2 strictly increasing"),
        ({"cut_points": [5, 2]}, r"pipelines\[0\]\.cut_points"),
        ({"replicas": [1]}, r"pipelines\[0\]\.replicas: must list one count per stage \(2\)"),
        ({"replicas": [1, 0]}, r"pipelines\[0\]\.replicas\[1\]: must be >= 1, got 0"),
        ({"boundary_dtype": "int8"}, r"pipelines\[0\]\.boundary_dtype: must be one of"),
        ({"balance": "vibes"}, r"pipelines\[0\]\.balance: must be one of"),
        ({"live_updates": True}, r"pipelines\[0\]\.live_updates: only the embedding stage"),
        (
            {"batching": {"mode": "static", "batch_size": 4}},
            r"pipelines\[0\]\.batching\.mode: every stage batches",
        ),
        ({"color": "red"}, r"pipelines\[0\]\.color: unknown field"),
    ],
)
def test_errors_name_the_field(spec_data: dict[str, Any], fields: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_spec(_with_pipeline(spec_data, **fields))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"stages": 3}, r"pipelines\[0\]\.stages: embedding_dense has exactly 2 stages"),
        ({"boundary_dtype": "bf16"}, r"pipelines\[0\]\.boundary_dtype: the dense stage reads numpy"),
        (
            {"live_updates": True, "replicas": [2, 1]},
            r"pipelines\[0\]\.replicas: an updatable embedding stage",
        ),
    ],
)
def test_embedding_dense_rules(spec_data: dict[str, Any], fields: dict[str, Any], message: str) -> None:
    data = _with_pipeline(spec_data, model="recommender", split="embedding_dense", **fields)
    with pytest.raises(SpecError, match=message):
        parse_spec(data)


def test_names_may_not_clash_with_models_or_stage_folders(spec_data: dict[str, Any]) -> None:
    with pytest.raises(SpecError, match=r"pipelines\[0\]\.name: 'recommender' is already"):
        parse_spec(_with_pipeline(spec_data, name="recommender"))
    data = _with_pipeline(spec_data)
    data["models"].append({**copy.deepcopy(data["models"][-1]), "name": "p_stage1"})
    with pytest.raises(SpecError, match=r"pipelines\[0\]\.name: 'p_stage1' is already"):
        parse_spec(data)


def test_models_cannot_declare_bf16_tensors(spec_data: dict[str, Any]) -> None:
    data = copy.deepcopy(spec_data)
    data["models"][0]["inputs"][0]["dtype"] = "bf16"
    with pytest.raises(SpecError, match=r"models\[0\]\.inputs\[0\]\.dtype"):
        parse_spec(data)
