"""What a model should answer: inputs drawn as the exporter draws them, and its source's outputs,
held to the exporter's tolerance (a ``.pt2`` program through the ONNX the sandbox made of it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from client.errors import ClientError, MismatchError
from exporters.artifacts.parity import ParityReport, compare_outputs
from exporters.errors import ExportCheckError, SpecError
from exporters.resolve import load_spec
from exporters.schema.models import ModelSpec
from exporters.sources.load import load_source


@dataclass(frozen=True)
class Reference:
    spec: ModelSpec
    inputs: dict[str, np.ndarray]
    expected: dict[str, np.ndarray]
    precision: str  # the tolerance to hold the server to (a pipeline's boundary dtype may loosen it)

    def compare(self, outputs: dict[str, np.ndarray], what: str) -> ParityReport:
        """The build's check (``exporters.artifacts.parity``); ``MismatchError`` outside tolerance."""
        names = [t.name for t in self.spec.outputs]
        tolerances = [t.tolerance for t in self.spec.outputs]
        try:
            return compare_outputs(
                [outputs[n] for n in names], [self.expected[n] for n in names], self.precision, what, names,
                tolerances,
            )  # fmt: skip
        except ExportCheckError as error:
            raise MismatchError(str(error)) from error


def reference(spec_path: Path, model: str, batch: int, seed: int = 0) -> Reference:
    """Inputs and reference outputs for ``model``: a model of the spec, or a pipeline (held to the model
    it splits, at the tolerance of its boundary dtype)."""
    try:
        document = load_spec(spec_path)
    except SpecError as error:  # the user's --spec, in the client's terms
        raise ClientError(str(error)) from error
    pipeline = next((p for p in document.pipelines if p.name == model), None)
    names = [m.name for m in document.models] + [p.name for p in document.pipelines]
    if pipeline is None and model not in names:
        servable = [*names, *(t.name for t in document.text_embeddings)]  # `infer` answers these too
        raise ClientError(
            f"{spec_path} has no model, pipeline or text embedding named {model!r} (it has "
            f"{', '.join(servable)}); pass --spec with the spec the server's repository was built from "
            "(`make serve SPEC=…` records it for you)"
        )
    spec = document.model(pipeline.model if pipeline else model)
    precision = pipeline.boundary_dtype if pipeline and pipeline.boundary_dtype != "fp32" else spec.precision
    try:
        source = load_source(spec)
        arrays = source.inputs(batch, seed)
        expected = source.reference(arrays)
    except SpecError as error:  # the source named by the spec cannot be loaded or sampled
        raise ClientError(str(error)) from error
    return Reference(
        spec,
        {t.name: a for t, a in zip(spec.inputs, arrays, strict=True)},
        {t.name: e for t, e in zip(spec.outputs, expected, strict=True)},
        precision,
    )
