"""models.yaml validation: the shipped spec parses, and each mistake names its model and field."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from exporters.errors import SpecError
from exporters.schema.models import parse_spec, with_absolute_paths


def test_shipped_spec_parses(spec_data: dict[str, Any]) -> None:
    spec = parse_spec(spec_data)
    names = [m.name for m in spec.models]
    assert {"recommender", "image_classifier"} <= set(names)
    recommender = spec.model("recommender")
    assert recommender.batching.mode == "dynamic"
    assert recommender.batching.queue is not None and recommender.batching.queue.max_queue_size > 0
    assert [t.name for t in recommender.inputs] == ["dense", "sparse_ids"]


def _with(spec_data: dict[str, Any], index: int, **changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(spec_data)
    for key, value in changes.items():
        if value is None:
            data["models"][index].pop(key)
        else:
            data["models"][index][key] = value
    return data


@pytest.mark.parametrize(
    ("index", "changes", "message"),
    [
        (
            1,
            {"batching": {"mode": "dynamic", "max_queue_delay_us": -5}},
            "models[1].batching.max_queue_delay_us: must be >= 0",
        ),
        (
            0,
            {"batching": {"mode": "dynamic", "preferred_batch_sizes": [128]}},
            "models[0].batching.preferred_batch_sizes[0]",
        ),
        (0, {"batching": {"mode": "static", "batch_size": 0}}, "models[0].batching.batch_size"),
        (
            0,
            {"batching": {"mode": "static", "batch_size": 8, "max_queue_delay_us": 10}},
            "need mode: dynamic",
        ),
        (0, {"batching": {"mode": "sometimes"}}, "models[0].batching.mode: must be one of"),
        (
            0,
            {"batching": {"mode": "dynamic", "queue": {"max_queue_size": -1}}},
            "models[0].batching.queue.max_queue_size",
        ),
        (0, {"max_batch_size": 0}, "models[0].max_batch_size: must be >= 1"),
        (0, {"max_batch_sise": 8}, "models[0].max_batch_sise: unknown field"),
        (0, {"source": "resnet50"}, "models[0].source: must be one of"),
        (0, {"options": {"depth": 3}}, "models[0].options.depth: unknown option for recommender"),
        (0, {"precision": "fp8"}, "models[0].precision"),
        (0, {"inputs": [{"name": "dense", "dtype": "fp16", "shape": [13]}]}, "models[0].inputs[0].dtype"),
        (0, {"inputs": [{"name": "dense", "dtype": "fp32", "shape": [0]}]}, "models[0].inputs[0].shape"),
        (0, {"instances": {"gpus": [0, 0]}}, "models[0].instances.gpus"),
        (0, {"instances": {"cpu": 0}}, "models[0].instances.cpu: must be >= 1"),
        (0, {"target": "tpu"}, "models[0].target"),
        (0, {"outputs": None}, "models[0].outputs: is required"),
        (2, {"threads": {"intra_op": -1}}, "models[2].threads.intra_op: must be >= 0"),
    ],
)
def test_errors_name_model_and_field(
    spec_data: dict[str, Any], index: int, changes: dict, message: str
) -> None:
    with pytest.raises(SpecError) as error:
        parse_spec(_with(spec_data, index, **changes))
    assert message in str(error.value)


def test_duplicate_model_names_rejected(spec_data: dict[str, Any]) -> None:
    data = copy.deepcopy(spec_data)
    data["models"].append(copy.deepcopy(data["models"][0]))
    with pytest.raises(SpecError, match=rf"models\[{len(data['models']) - 1}\].name: duplicate"):
        parse_spec(data)


def test_with_absolute_paths_resolves_sources_and_leaves_what_does_not_parse(tmp_path) -> None:
    """A source's path becomes absolute against the spec's folder; an entry that does not parse, a zoo
    source and whatever is not a model stay as written, for ``parse_spec`` to name."""
    own = {
        "name": "mine", "source": {"onnx": "models/mine.onnx"}, "max_batch_size": 4,
        "inputs": [{"name": "x", "dtype": "fp32", "shape": [4]}],
        "outputs": [{"name": "y", "dtype": "fp32", "shape": [4]}],
    }  # fmt: skip
    broken = {**own, "name": "broken", "max_batch_size": -1}
    zoo = {"name": "trivial", "source": "trivial"}
    data = {"models": [own, broken, zoo, "not a mapping"], "pipelines": []}
    resolved = with_absolute_paths(data, tmp_path)
    assert resolved["models"][0] == {**own, "source": {"onnx": str(tmp_path / "models" / "mine.onnx")}}
    assert resolved["models"][1:] == [broken, zoo, "not a mapping"]
    assert resolved["pipelines"] == [] and data["models"][0] == own  # the document given is not changed
    assert with_absolute_paths(["not", "a", "spec"], tmp_path) == ["not", "a", "spec"]
