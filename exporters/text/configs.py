"""Triton configs of a text-embedding service: tokenizer (Python), encoder (ONNX), and the ensemble.

The batcher merges requests of the same padded length, which the tokenizer's buckets provide.
``ragged=True`` is the alternative the perf study compares against: ``allow_ragged_batch``, and the
encoder on our onnxruntime ``model.py``, which pads each batch to its longest (the native backend
would concatenate ragged inputs unpadded, so it is never the default).
"""

from __future__ import annotations

from dataclasses import dataclass

from exporters.configs.model_config import InstanceGroup, ModelConfig, ModelTensor, ModelWarmup, WarmupInput
from exporters.configs.models import chained_ensemble, dynamic_batching, instance_groups
from exporters.schema.guards import guard_parameters
from exporters.schema.text_embeddings import TextEmbeddingSpec

EMBEDDING_DIM = 384
TOKEN_INPUTS = ("input_ids", "attention_mask")
TEXT = ModelTensor("text", "TYPE_STRING", [1])
EMBEDDING = ModelTensor("embedding", "TYPE_FP32", [EMBEDDING_DIM])


@dataclass
class RaggedModelInput(ModelTensor):
    """An encoder input the batcher may merge across lengths (``ModelInput.allow_ragged_batch``)."""

    allow_ragged_batch: bool = True


def tokenizer_config(spec: TextEmbeddingSpec) -> ModelConfig:
    """Tokenization is CPU work on every target; ``pad_buckets`` empty pads to each request's longest."""
    return ModelConfig(
        name=spec.tokenizer_name,
        backend="python",
        max_batch_size=spec.max_batch_size,
        input=[TEXT],
        output=[ModelTensor(name, "TYPE_INT64", [-1]) for name in TOKEN_INPUTS],
        instance_group=[InstanceGroup(kind="KIND_CPU", count=1)],
        dynamic_batching=dynamic_batching(spec.batching),
        parameters={
            "max_seq_length": str(spec.max_seq_length),
            "pad_buckets": ",".join(str(b) for b in spec.buckets),
        },
    )


def encoder_config(
    spec: TextEmbeddingSpec, num_gpus: int, ragged: bool = False, vocab_size: int | None = None
) -> ModelConfig:
    """The ONNX encoder on the ``onnxruntime`` backend (or, ragged, on the Python backend), warmed at
    every padded length the tokenizer emits. Requests that call it by name are held to what the
    tokenizer gives: ids inside the vocabulary, a 0/1 mask, at most ``max_seq_length`` tokens."""
    ranges = {"input_ids": (0, vocab_size), "attention_mask": (0, 2)} if vocab_size is not None else {}
    longest = {name: (spec.max_seq_length,) for name in TOKEN_INPUTS}
    warmups = [
        ModelWarmup(
            f"length_{n}", 1, {t: WarmupInput("TYPE_INT64", [n], zero_data=True) for t in TOKEN_INPUTS}
        )
        for n in spec.buckets or (spec.max_seq_length,)
    ]
    return ModelConfig(
        name=spec.encoder_name,
        backend="python" if ragged else "onnxruntime",
        max_batch_size=spec.max_batch_size,
        input=[(RaggedModelInput if ragged else ModelTensor)(n, "TYPE_INT64", [-1]) for n in TOKEN_INPUTS],
        output=[EMBEDDING],
        instance_group=instance_groups(spec, num_gpus),
        dynamic_batching=dynamic_batching(spec.batching),
        model_warmup=warmups,
        parameters={
            "intra_op_thread_count": str(spec.threads.intra_op),
            "inter_op_thread_count": str(spec.threads.inter_op),
            **guard_parameters(ranges, allow_non_finite=False, max_shapes=longest),
        },
    )


def text_configs(
    spec: TextEmbeddingSpec, num_gpus: int, ragged: bool = False, vocab_size: int | None = None
) -> list[ModelConfig]:
    """The configs of the ensemble (``text`` → tokenizer → encoder → ``embedding``), tokenizer, encoder."""
    steps = [(spec.tokenizer_name, ["text"], TOKEN_INPUTS), (spec.encoder_name, TOKEN_INPUTS, ["embedding"])]
    ensemble = chained_ensemble(spec.name, spec.max_batch_size, [TEXT], [EMBEDDING], steps)
    return [ensemble, tokenizer_config(spec), encoder_config(spec, num_gpus, ragged, vocab_size)]
