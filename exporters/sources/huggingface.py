"""``source: {huggingface: folder or package}``: a transformers model, loaded offline from a folder or
an installed package's ``get_model_path()``; the spec's tensors are ``forward``'s arguments and outputs
by name."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from exporters.errors import SpecError
from exporters.schema.models import HuggingFaceSource, ModelSpec
from exporters.sources.base import LoadedSource, TorchModuleSource


def model_folder(location: str, field: str) -> Path:
    """The folder holding ``config.json``: ``location`` itself, or an installed package's weights."""
    folder = Path(location)
    if not folder.is_dir():
        try:
            package = importlib.import_module(location.replace("-", "_"))
        except ImportError as error:
            raise SpecError(field, f"{location!r} is neither a folder nor an installed package") from error
        getter = getattr(package, "get_model_path", None)
        if getter is None:
            raise SpecError(
                field, f"package {location!r} has no get_model_path() saying where its weights are"
            )
        folder = Path(getter())
    if not (folder / "config.json").is_file():
        raise SpecError(field, f"{folder} has no config.json (not a transformers model folder)")
    if not any(folder.glob("*.safetensors")):
        raise SpecError(
            field,
            f"{folder} has no safetensors weights (model.safetensors): a Hugging Face folder is loaded from "
            "safetensors only, never from a pickle such as pytorch_model.bin, which torch would deserialise "
            "(docs/SERVING.md, Trust boundary); save the model with save_pretrained(), whose default format "
            "is safetensors",
        )
    return folder


class NamedOutputs(nn.Module):
    """A transformers model with positional tensors in and a tuple of named outputs out (exportable)."""

    def __init__(self, model: nn.Module, input_names: list[str], output_names: list[str]) -> None:
        super().__init__()
        self.model, self.input_names, self.output_names = model, input_names, output_names

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        result = self.model(**dict(zip(self.input_names, tensors, strict=True)), return_dict=True)
        missing = [name for name in self.output_names if name not in result]
        if missing:
            raise SpecError("outputs", f"the model gives no {missing[0]!r} (it gives {list(result.keys())})")
        return tuple(result[name] for name in self.output_names)


def quiet_transformers() -> None:
    """No progress bar and no weight-loading report on every command that loads a model."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    transformers_logging.set_verbosity_error()


def load_model(folder: Path) -> nn.Module:
    """The model in ``folder``, from safetensors only: a ``pytorch_model.bin`` is a pickle torch would
    deserialise here (docs/SERVING.md, "Trust boundary"); its own code is never run."""
    from transformers import AutoModel

    quiet_transformers()
    # Eager attention: one plain graph that both exporters and onnxruntime handle at every length.
    return AutoModel.from_pretrained(
        str(folder), local_files_only=True, attn_implementation="eager", use_safetensors=True
    ).eval()


def load_huggingface(spec: ModelSpec) -> LoadedSource:
    assert isinstance(spec.source, HuggingFaceSource)
    field = f"{spec.name}.source.huggingface"
    folder = model_folder(spec.source.huggingface, field)
    try:
        model = load_model(folder)
    except (OSError, ValueError) as error:
        raise SpecError(field, f"cannot load {folder} offline: {error}") from error
    # eval() on the wrapper too: the exporter restores the top module's mode recursively afterwards.
    module = NamedOutputs(model, [t.name for t in spec.inputs], [t.name for t in spec.outputs]).eval()
    return TorchModuleSource(spec, module, [folder / "config.json"])


def describe(folder: Path) -> dict[str, Any]:
    """Vocabulary, width and longest input (sentence-transformers' ``max_seq_length`` first), for ``init``."""
    config = json.loads((folder / "config.json").read_text())
    sentence = folder / "sentence_bert_config.json"
    longest = config.get("max_position_embeddings", 512)
    if sentence.is_file():
        longest = json.loads(sentence.read_text()).get("max_seq_length", longest)
    return {"vocab_size": config["vocab_size"], "hidden_size": config["hidden_size"], "max_length": longest}
