"""The spec's dataclasses are its schema: round trips, checks that ``replace`` cannot bypass, choices and
allowed keys derived from the fields, and an error naming model and field for every key."""

from __future__ import annotations

import copy
import dataclasses
import typing
from typing import Any, Literal

import pytest

from exporters.errors import SpecError
from exporters.schema.models import Batching, Instances, ModelSpec, PipelineSpec, TensorSpec, parse_spec
from exporters.schema.typed import hints, to_data


def choices(cls: type, name: str) -> tuple[Any, ...]:
    """The ``Literal`` values field ``name`` of ``cls`` allows (read from its type hint)."""
    arms = typing.get_args(hints(cls)[name])
    literal = next((arm for arm in arms if typing.get_origin(arm) is Literal), hints(cls)[name])
    return typing.get_args(literal)


def test_every_section_round_trips_through_yaml_data(spec_data: dict[str, Any]) -> None:
    spec = parse_spec(spec_data)
    data = {
        "models": to_data(spec.models),
        "pipelines": to_data(spec.pipelines),
        "text_embeddings": to_data(spec.text_embeddings),
    }
    assert parse_spec(data) == spec
    # Defaults are left out, so what comes back is what a person would write.
    assert "seed" not in data["models"][0] and data["models"][0]["max_batch_size"] == 64


def test_choices_and_allowed_keys_come_from_the_dataclasses(spec_data: dict[str, Any]) -> None:
    assert choices(Batching, "mode") == ("none", "static", "dynamic")
    assert choices(Instances, "gpus") == ("all",)
    data = copy.deepcopy(spec_data)
    data["models"][0]["batching"]["mode"] = "eventually"
    with pytest.raises(SpecError, match=r"models\[0\]\.batching\.mode: must be one of none, static, dynamic"):
        parse_spec(data)
    data = copy.deepcopy(spec_data)
    data["models"][0]["instances"]["per_cpu"] = 2
    with pytest.raises(
        SpecError, match=f"allowed: {', '.join(sorted(f.name for f in dataclasses.fields(Instances)))}"
    ):
        parse_spec(data)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda s: dataclasses.replace(s.batching, max_queue_delay_us=-1),
            "max_queue_delay_us: must be >= 0",
        ),
        (lambda s: dataclasses.replace(s.batching, mode="none"), "need mode: dynamic"),
        (lambda s: dataclasses.replace(s, max_batch_size=0), "max_batch_size: must be >= 1"),
        (
            lambda s: dataclasses.replace(s, max_batch_size=4),
            r"batching.preferred_batch_sizes\[0\]: must be in 1..max_batch_size \(4\), got 8",
        ),
        (
            lambda s: dataclasses.replace(s, precision="fp16"),
            r"inputs\[0\].dtype: float tensors of precision fp16 are fp16",
        ),
        (lambda s: dataclasses.replace(s, source="resnet"), "source: must be one of"),
        (lambda s: dataclasses.replace(s, instances=Instances(gpus=(0, 0))), "gpus: must be 'all' or a list"),
        (
            lambda s: dataclasses.replace(s.inputs[0], shape=(-1,)),
            "max_shape: is required with a variable axis",
        ),
        (lambda s: dataclasses.replace(s.inputs[0], range=(0, 9)), "range: is for integer tensors"),
        (lambda s: dataclasses.replace(s.inputs[0], name="x\ty"), "name: must be 1 to 256 printable"),
        (lambda s: dataclasses.replace(s.inputs[0], name=" x"), "without surrounding spaces"),
    ],
)
def test_replace_cannot_bypass_the_checks(model_spec, make, message: str) -> None:
    image = model_spec("image_classifier")
    with pytest.raises(SpecError, match=message):
        make(image)


def test_replace_of_a_pipeline_is_checked(spec_data: dict[str, Any]) -> None:
    pipeline = parse_spec(spec_data).pipeline("image_classifier_pipeline")
    with pytest.raises(SpecError, match="replicas: must list one count per stage"):
        dataclasses.replace(pipeline, replicas=(1,))
    with pytest.raises(SpecError, match="live_updates: only the embedding stage"):
        dataclasses.replace(pipeline, live_updates=True)
    assert isinstance(dataclasses.replace(pipeline, replicas=(1, 2)), PipelineSpec)


def test_variable_axes_need_a_bound_that_fits() -> None:
    tensor = TensorSpec("ids", "int64", (-1,), max_shape=(128,), range=(0, 1000))
    assert tensor.variable and tensor.largest == (128,)
    with pytest.raises(SpecError, match="max_shape: must have shape's length"):
        TensorSpec("ids", "int64", (-1, 4), max_shape=(128, 5))


def _own(**changes: Any) -> dict[str, Any]:
    entry = {
        "name": "mine",
        "source": {"python": "own_model.net:build", "path": "examples/own_model"},
        "max_batch_size": 8,
        "inputs": [{"name": "ids", "dtype": "int64", "shape": [-1], "max_shape": [32], "range": [0, 100]}],
        "outputs": [{"name": "score", "dtype": "fp32", "shape": [1]}],
    }
    entry.update(changes)
    return {"models": [entry]}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"source": {"pytorch": "x.pt"}},
            r"models\[0\]\.source: a mapping here needs one of the keys python, onnx",
        ),
        (
            {"source": {"python": "own_model.net"}},
            r"models\[0\]\.source\.python: must be 'package.module:factory'",
        ),
        ({"source": {"python": "m:f", "dir": "x"}}, r"models\[0\]\.source\.dir: unknown field"),
        ({"source": {"onnx": 3}}, r"models\[0\]\.source\.onnx: must be a string"),
        (
            {"source": {"onnx": "m.onnx"}, "options": {"a": 1}},
            r"models\[0\]\.options: onnx sources take no options",
        ),
        ({"sample": "nocolon"}, r"models\[0\]\.sample: must be 'package.module:function'"),
        ({"lengths": [64]}, r"models\[0\]\.lengths\[0\]: 64 exceeds every variable axis"),
        ({"lengths": [0]}, r"models\[0\]\.lengths\[0\]: must be >= 1"),
        (
            {"inputs": [{"name": "ids", "dtype": "int64", "shape": [-1], "max_shape": [32]}]},
            r"models\[0\]\.inputs\[0\]\.range: integer inputs of a python source need range",
        ),
        (
            {"inputs": [{"name": "ids", "dtype": "int64", "shape": [-1], "range": [0, 9]}]},
            r"models\[0\]\.inputs\[0\]\.max_shape: is required with a variable axis",
        ),
        (
            {"inputs": [{"name": "ids", "dtype": "int64", "shape": [4], "range": [9, 9]}]},
            r"models\[0\]\.inputs\[0\]\.range: must be \[lo, hi\) with lo < hi",
        ),
        (
            {"inputs": [{"name": "ids", "dtype": "int64", "shape": [4], "range": [0, 9, 10]}]},
            r"models\[0\]\.inputs\[0\]\.range: must be a list of 2 values",
        ),
        (
            {"outputs": [{"name": "score", "dtype": "fp32", "shape": [1], "range": [0, 1]}]},
            r"models\[0\]\.outputs\[0\]\.range: is for integer tensors",
        ),
        ({"outputs": []}, r"models\[0\]\.outputs: is required"),
    ],
)
def test_new_keys_name_model_and_field(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_spec(_own(**changes))


def test_an_own_model_entry_parses_with_paths_relative_to_the_spec(tmp_path) -> None:
    spec = parse_spec(_own(lengths=[4, 32]), base_dir=tmp_path)
    model = spec.model("mine")
    assert isinstance(model, ModelSpec) and model.source_kind == "python"
    assert model.source.path == str(tmp_path / "examples" / "own_model")
    assert model.inputs[0].range == (0, 100) and model.lengths == (4, 32)
