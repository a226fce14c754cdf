"""``models.yaml`` → the ``Spec`` the build, the clients and perf work from, every signature complete:
tensors a self-describing source (ONNX, ``torch.export``) leaves out of the spec are read from it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from exporters.errors import SpecError
from exporters.schema.bounded_yaml import load_spec_document
from exporters.schema.models import SELF_DESCRIBING, ModelSpec, Spec, parse_spec
from exporters.schema.typed import nested
from exporters.sources.signature import read_signature


def resolve_model(spec: ModelSpec, path: str) -> ModelSpec:
    """``spec`` with the tensors its artifact states where the spec left them out, errors named by path."""
    if spec.source_kind not in SELF_DESCRIBING or (spec.inputs and spec.outputs):
        return spec
    try:
        inputs, outputs = read_signature(spec)
    except SpecError as error:  # named by the model's name there; by its place in the file here
        raise SpecError(path + error.path.removeprefix(spec.name), error.problem) from None
    try:
        return dataclasses.replace(spec, inputs=spec.inputs or inputs, outputs=spec.outputs or outputs)
    except SpecError as error:
        raise nested(path, error) from None


def resolve_spec(spec: Spec) -> Spec:
    models = tuple(resolve_model(model, f"models[{i}]") for i, model in enumerate(spec.models))
    return spec if models == spec.models else dataclasses.replace(spec, models=models)


def load_spec(path: str | Path) -> Spec:
    """Read (bounded), validate and resolve a ``models.yaml``; its folder anchors its relative paths."""
    return resolve_spec(parse_spec(load_spec_document(path), Path(path).resolve().parent))
