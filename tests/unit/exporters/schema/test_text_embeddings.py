"""The spec's text_embeddings section (``exporters.schema.text_embeddings``): models.yaml serves fp32, fp16
and int8, and each mistake names its field."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from exporters.errors import SpecError
from exporters.schema.models import parse_spec


def _with_text(spec_data: dict[str, Any], **changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(spec_data)
    data["text_embeddings"][0].update(changes)
    return data


def test_models_yaml_serves_fp32_fp16_and_int8_text_embeddings(spec_data: dict[str, Any]) -> None:
    entries = parse_spec(spec_data).text_embeddings
    assert [(t.name, t.precision) for t in entries] == [
        ("text_embedding", "fp32"),
        ("text_embedding_fp16", "fp16"),
        ("text_embedding_int8", "int8"),
    ]
    assert entries[0].max_seq_length == 256 and entries[0].buckets[-1] == 256
    assert entries[0].repository_names == (
        "text_embedding",
        "text_embedding_tokenizer",
        "text_embedding_encoder",
    )


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        (
            {"buckets": [16, 64, 128]},
            "text_embeddings[0].buckets: the last bucket must be max_seq_length (256)",
        ),
        ({"buckets": [64, 16, 256]}, "text_embeddings[0].buckets: must be strictly increasing"),
        ({"batching": {"mode": "static", "batch_size": 8}}, "text_embeddings[0].batching.mode"),
        ({"max_seq_lenght": 128}, "text_embeddings[0].max_seq_lenght: unknown field"),
        ({"name": "recommender"}, "text_embeddings[0].name: 'recommender' is already a model"),
        ({"package": "not a module"}, "text_embeddings[0].package: must be an importable module name"),
        (
            {"tolerance": {"kind": "class_scores"}},
            "text_embeddings[0].tolerance.kind: the output is an embedding",
        ),
    ],
)
def test_text_spec_errors_name_the_field(spec_data: dict[str, Any], changes: dict, fragment: str) -> None:
    with pytest.raises(SpecError) as raised:
        parse_spec(_with_text(spec_data, **changes))
    assert fragment in str(raised.value)
