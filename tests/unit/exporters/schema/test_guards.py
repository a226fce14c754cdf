"""The spec's input guards (``exporters.schema.guards``) as the config carries them: the parameters
each model's config gets, bad ones named, and the encoder holding direct requests to what the
tokenizer sends."""

from __future__ import annotations

import json

import numpy as np
import pytest

from exporters.configs.models import build_model_config
from exporters.schema.guards import guard_parameters
from exporters.schema.models import parse_spec
from exporters.text.embedding import text_configs
from python_backend.batching import (
    InvalidInputError,
    TensorInfo,
    with_value_guards,
)
from tests.unit.python_backend.request_checks import validate


def test_config_parameters_carry_the_guards(model_spec) -> None:
    config = build_model_config(model_spec("recommender"), num_gpus=0)
    assert config.parameters["allow_non_finite_inputs"] == "false"
    assert json.loads(config.parameters["input_ranges"]) == {"sparse_ids": [0, 10000]}
    entries = {"parameters": {k: {"string_value": v} for k, v in config.parameters.items()}}
    infos = [
        TensorInfo("dense", np.dtype(np.float32), (13,)),
        TensorInfo("sparse_ids", np.dtype(np.int64), (8,)),
    ]
    dense, ids = with_value_guards(infos, entries)
    assert dense.finite and dense.bounds is None and ids.bounds == (0, 10000)
    allowed = model_spec("recommender", allow_non_finite=True)
    assert build_model_config(allowed, 0).parameters["allow_non_finite_inputs"] == "true"
    assert [i.finite for i in with_value_guards(infos, {})] == [True, True]  # NaN rejected by default


def test_bad_guard_parameters_are_named() -> None:
    infos = [TensorInfo("x", np.dtype(np.int64), (1,))]
    params = guard_parameters({"y": (0, 1)}, allow_non_finite=False)
    entries = {"parameters": {k: {"string_value": v} for k, v in params.items()}}
    with pytest.raises(ValueError, match=r"input_ranges names no input of the model: \['y'\]"):
        with_value_guards(infos, entries)
    with pytest.raises(ValueError, match="allow_non_finite_inputs must be true or false"):
        with_value_guards(infos, {"parameters": {"allow_non_finite_inputs": {"string_value": "maybe"}}})


def test_the_encoder_holds_direct_requests_to_what_the_tokenizer_sends(spec_data) -> None:
    """An ensemble member is no way around the ensemble's checks: the encoder refuses what the tokenizer
    never sends (ids outside the vocabulary, a mask other than 0/1, more than max_seq_length tokens)."""
    spec = parse_spec(spec_data).text_embeddings[0]
    encoder = text_configs(spec, num_gpus=0, vocab_size=30522)[2].to_proto()
    ranges = json.loads(encoder.parameters["input_ranges"].string_value)
    assert ranges == {"input_ids": [0, 30522], "attention_mask": [0, 2]}
    longest = json.loads(encoder.parameters["input_max_shapes"].string_value)  # the fronts bound it too
    assert longest == {"input_ids": [spec.max_seq_length], "attention_mask": [spec.max_seq_length]}
    infos = [TensorInfo(n, np.dtype(np.int64), (-1,)) for n in ("input_ids", "attention_mask")]
    entries = {"parameters": {k: {"string_value": v.string_value} for k, v in encoder.parameters.items()}}
    guarded = with_value_guards(infos, entries)
    with pytest.raises(InvalidInputError, match=r"input 'input_ids' holds -5, outside its declared range"):
        validate({"input_ids": np.array([[-5, 1]]), "attention_mask": np.array([[1, 1]])}, guarded)
    with pytest.raises(InvalidInputError, match=r"input 'attention_mask' holds 7, outside"):
        validate({"input_ids": np.array([[5, 1]]), "attention_mask": np.array([[7, 1]])}, guarded)
