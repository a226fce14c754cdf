"""The text-embedding service's configs (``exporters.text.embedding``): written and read back with a variable
sequence axis, valid for the native backend; the ragged variant on the Python backend."""

from __future__ import annotations

from typing import Any

from exporters.configs.model_config import read_config, write_config
from exporters.schema.models import parse_spec
from exporters.text.embedding import text_configs


def test_configs_round_trip_with_a_variable_sequence_axis(spec_data: dict[str, Any], tmp_path) -> None:
    spec = parse_spec(spec_data).text_embeddings[0]
    for config in text_configs(spec, num_gpus=0):
        parsed = read_config(write_config(config, tmp_path / config.name))
        assert parsed == config.to_proto()
    ensemble, tokenizer, encoder = (read_config(tmp_path / n / "config.pbtxt") for n in spec.repository_names)
    assert [s.model_name for s in ensemble.ensemble_scheduling.step] == [
        spec.tokenizer_name,
        spec.encoder_name,
    ]
    assert encoder.backend == "onnxruntime" and [list(i.dims) for i in encoder.input] == [[-1], [-1]]
    assert not any(i.allow_ragged_batch for i in encoder.input)  # valid for the native backend
    assert [w.inputs["input_ids"].dims for w in encoder.model_warmup] == [[b] for b in spec.buckets]
    assert tokenizer.parameters["pad_buckets"].string_value == "16,32,64,128,256"


def test_ragged_variant_runs_on_the_python_backend(spec_data: dict[str, Any]) -> None:
    spec = parse_spec(spec_data).text_embeddings[0]
    encoder = text_configs(spec, num_gpus=0, ragged=True)[2].to_proto()
    assert encoder.backend == "python" and all(i.allow_ragged_batch for i in encoder.input)
