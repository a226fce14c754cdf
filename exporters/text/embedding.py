"""Build a text-embedding service from packaged real weights: encoder ONNX, tokenizer stage, configs.

The encoder is the package's BERT plus sentence-transformers' mean pooling and L2 normalisation in one
graph, so the served output is the sentence embedding. fp16 converts the fp32 graph (a graph exported
from a halved module does not load) keeping ``LayerNormalization``, whose fp16 variance loses too much,
in fp32. The batcher merges requests of the same padded length, which the tokenizer's buckets give;
``ragged=True``, which the perf study compares, serves the encoder with ``allow_ragged_batch`` on our
onnxruntime ``model.py``, padding each batch to its longest (the native backend would concatenate ragged
inputs unpadded, so it is never the default)."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn.functional as F  # noqa: N812 (the conventional name)
from torch import nn

from exporters.artifacts.onnx_files import OPSET, check_external_data, module_to_onnx
from exporters.artifacts.parity import compare_outputs, worst_of
from exporters.artifacts.records import current_record, file_sha256, lend_export, write_record
from exporters.configs.model_config import (
    InstanceGroup,
    ModelConfig,
    ModelInput,
    ModelTensor,
    ModelWarmup,
    WarmupInput,
    write_config,
)
from exporters.configs.models import chained_ensemble, dynamic_batching, instance_groups
from exporters.errors import SpecError
from exporters.precision.fp16 import to_fp16
from exporters.precision.int8 import to_int8_dynamic
from exporters.schema.guards import guard_parameters
from exporters.schema.text_embeddings import TextEmbeddingSpec
from exporters.sources import huggingface
from python_backend import ONNXRUNTIME_BACKEND, TEXT_TOKENIZER, install
from python_backend.atomic_files import copy_file, staged

log = logging.getLogger(__name__)

EXPORT_VERSION = "3"  # bump when the procedure changes, to invalidate cached artifacts
RECORD = "export.json"
# Texts the build check runs: short, accented, CJK, emoji, and one past the truncation length.
CHECK_TEXTS = (
    "A man is eating food.",
    "",
    "Café crème brûlée, naïve façade.",
    "東京は日本の首都です。",
    "I love it 😀🎉",
    " ".join(f"word{i} and more" for i in range(200)),
)


EMBEDDING_DIM = 384
TOKEN_INPUTS = ("input_ids", "attention_mask")
TEXT = ModelTensor("text", "TYPE_STRING", [1])
EMBEDDING = ModelTensor("embedding", "TYPE_FP32", [EMBEDDING_DIM])


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
        input=[ModelInput(n, "TYPE_INT64", [-1], allow_ragged_batch=ragged) for n in TOKEN_INPUTS],
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


class SentenceEncoder(nn.Module):
    """BERT → mean of the token states the attention mask keeps → unit length (sentence-transformers)."""

    def __init__(self, bert: nn.Module) -> None:
        super().__init__()
        self.bert = bert

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        mean = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        return F.normalize(mean, p=2.0, dim=1)


def model_folder(package: str) -> Path:
    """The weights folder a package carries (``get_model_path()``), with the tokenizer the service runs."""
    folder = huggingface.model_folder(package, "package")
    if not (folder / "tokenizer.json").is_file():
        raise SpecError("package", f"{folder} holds no tokenizer.json")
    return folder


def check_batches(folder: Path, max_length: int) -> list[dict[str, np.ndarray]]:
    """Token batches the parity check runs: the check texts one by one and all together (padded)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.enable_truncation(max_length)
    tokenizer.enable_padding()
    batches = []
    for texts in [[t] for t in CHECK_TEXTS[:2]] + [list(CHECK_TEXTS)]:
        encodings = tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        batches.append({"input_ids": ids, "attention_mask": mask})
    return batches


def content_hash(spec: TextEmbeddingSpec, folder: Path) -> str:
    digest = hashlib.sha256()
    identity = dict(precision=spec.precision, opset=OPSET, export=EXPORT_VERSION, torch=torch.__version__)
    digest.update(json.dumps(identity, sort_keys=True).encode())
    for name in ("config.json", "model.safetensors"):
        digest.update((folder / name).read_bytes())
    return digest.hexdigest()


def calibration_batches(
    folder: Path, batches: int = 8, rows: int = 16, length: int = 64
) -> list[dict[str, np.ndarray]]:
    """Seeded batches of random token ids framed by ``[CLS]``/``[SEP]`` (4 to ``length`` per row, the rest
    masked): the outlier channels int8 keeps are the model's, so random ids find them without a corpus."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    first, last = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    vocab_size = json.loads((folder / "config.json").read_text())["vocab_size"]
    rng = np.random.default_rng(8)
    out = []
    for _ in range(batches):
        ids = np.zeros((rows, length), dtype=np.int64)
        mask = np.zeros((rows, length), dtype=np.int64)
        for row, count in enumerate(rng.integers(4, length + 1, size=rows)):
            ids[row, 1 : count - 1] = rng.integers(1000, vocab_size, size=count - 2)
            ids[row, 0], ids[row, count - 1] = first, last
            mask[row, :count] = 1
        out.append({"input_ids": ids, "attention_mask": mask})
    return out


def encoder_onnx(
    encoder: SentenceEncoder, example: dict[str, np.ndarray], precision: str,
    calibration: list[dict[str, np.ndarray]],
) -> bytes:  # fmt: skip
    """The encoder as ONNX bytes in ``precision`` (fp16 and int8 made from the fp32 graph)."""
    data = module_to_onnx(
        encoder, tuple(torch.from_numpy(example[name]) for name in TOKEN_INPUTS), list(TOKEN_INPUTS),
        ["embedding"], variable_axes={name: {1: "sequence"} for name in TOKEN_INPUTS},
    )  # fmt: skip
    if precision == "fp32":
        return data
    if precision == "int8":
        return to_int8_dynamic(data, calibration)
    model = onnx.load_from_string(data)
    return to_fp16(model, keep_io_types=True, block=["LayerNormalization"]).SerializeToString()


def export_encoder(
    spec: TextEmbeddingSpec, folder: Path, out_dir: Path, done: dict[str, Path] | None = None
) -> dict[str, Any]:
    """``out_dir/model.onnx`` for ``spec.precision``, checked against torch; the export record.
    ``done`` maps content hashes to folders this build exported: an identical encoder is copied."""
    digest = content_hash(spec, folder)
    path, record_path = out_dir / "model.onnx", out_dir / RECORD
    if digest in (done or {}):
        lend_export(done[digest], out_dir, digest)
    if done is not None:
        done[digest] = out_dir
    record = current_record(record_path, path, digest)  # an identical export whose file is still there
    if record is not None:
        return record | {"cached": True}
    encoder = SentenceEncoder(huggingface.load_model(folder)).eval()
    batches = check_batches(folder, spec.max_seq_length)
    data = encoder_onnx(encoder, batches[-1], spec.precision, calibration_batches(folder))
    with staged(path, len(data)) as staging:
        staging.write_bytes(data)
        onnx.checker.check_model(str(staging), full_check=True)
        check_external_data(staging)
        session = ort.InferenceSession(str(staging), providers=["CPUExecutionProvider"])
        reports, limits = [], [spec.output_tolerance]
        for batch in batches:  # the worst figures over the batches; ExportCheckError when any fails
            (actual,) = session.run(["embedding"], batch)
            with torch.inference_mode():
                expected = encoder(*(torch.from_numpy(batch[n]) for n in TOKEN_INPUTS)).numpy()
            what = f"{spec.encoder_name} ({spec.precision}, {actual.shape[0]} texts)"
            reports.append(compare_outputs([actual], [expected], spec.precision, what, ["embedding"], limits))
        (check,) = worst_of(reports).checks
        sha256 = file_sha256(staging)
    record = {
        "content_hash": digest, "precision": spec.precision, "package": spec.package,
        "max_abs_error": check.max_abs_error, "min_cosine": check.min_cosine, "outputs": [check.record()],
        "file_sha256": sha256,
    }  # fmt: skip
    write_record(record_path, record)
    log.info("%s: exported %s, %s", spec.encoder_name, spec.precision, check.summary())
    return record | {"cached": False}


def build_text_embedding(
    spec: TextEmbeddingSpec, repository: Path, num_gpus: int, ragged: bool = False,
    done: dict[str, Path] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The service's three models in ``repository``; the encoder's export record."""
    folder = model_folder(spec.package)
    vocab_size = json.loads((folder / "config.json").read_text())["vocab_size"]
    configs = text_configs(spec, num_gpus, ragged, vocab_size)  # placement errors before the slow export
    record = export_encoder(spec, folder, repository / spec.encoder_name / "1", done)
    if ragged:  # padded to longest: our onnxruntime model.py, served as a Python-backend model
        install(ONNXRUNTIME_BACKEND, repository / spec.encoder_name / "1")
    # The tokenizer stage's model.py and helpers, and the package's tokenizer.json.
    install(TEXT_TOKENIZER, repository / spec.tokenizer_name / "1")
    copy_file(folder / "tokenizer.json", repository / spec.tokenizer_name / "1" / "tokenizer.json")
    (repository / spec.name / "1").mkdir(parents=True, exist_ok=True)  # ensembles need a version
    for config in configs:
        write_config(config, repository / config.name)
    return record


def build_text_embeddings(
    specs: Iterable[TextEmbeddingSpec], repository: Path, num_gpus: int, only: Iterable[str] | None = None
) -> list[tuple[TextEmbeddingSpec, dict[str, Any]]]:
    """Each service (or those named in ``only``) with its encoder's export record."""
    wanted = None if only is None else set(only)
    built = []
    done: dict[str, Path] = {}
    for spec in [s for s in specs if wanted is None or s.name in wanted]:
        try:
            built.append((spec, build_text_embedding(spec, repository, num_gpus, done=done)))
        except SpecError as error:
            raise SpecError(f"{spec.name}.{error.path}", error.problem) from error
    return built
