"""The parity check cannot be fooled: no absolute floor, collapse detection, per-output tolerances from the
spec, the same limits at build time and in ``client infer --check``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from client.errors import MismatchError
from client.reference import Reference
from exporters.artifacts.parity import MAX_REL, check_outputs, resolved
from exporters.errors import ExportCheckError, SpecError
from exporters.onnx_export import export_onnx
from exporters.schema.models import parse_spec
from exporters.schema.sections import Tolerance

FACTORIES = Path(__file__).resolve().parents[3] / "data" / "own_factories"


def _classifier(precision: str = "fp32", scale: float = 1e-9, tolerance: dict | None = None, **fields: Any):
    output: dict[str, Any] = {"name": "logits", "dtype": precision, "shape": [10]}
    if tolerance is not None:
        output["tolerance"] = tolerance
    entry = {
        "name": "tiny", "source": {"python": "factories:tiny_logits", "path": str(FACTORIES)},
        "options": {"scale": scale}, "max_batch_size": 8, "precision": precision,
        "inputs": [{"name": "x", "dtype": precision, "shape": [16]}], "outputs": [output], **fields,
    }  # fmt: skip
    return parse_spec({"models": [entry]}).model("tiny")


def test_an_fp16_build_whose_outputs_underflow_fails_naming_the_output_and_the_check(tmp_path: Path) -> None:
    with pytest.raises(
        ExportCheckError, match=r"tiny \(fp16 ONNX, batch 1\).*logits: collapsed: every value is 0"
    ):
        export_onnx(_classifier("fp16"), tmp_path)
    assert not (tmp_path / "model.onnx").exists()
    fp32 = export_onnx(_classifier("fp32"), tmp_path / "fp32")  # fp32 carries the same tiny logits
    assert fp32.max_rel_error <= MAX_REL["fp32"]


def test_outputs_below_what_fp16_represents_fail_even_when_not_all_zero() -> None:
    """The mobilenet-like case: logits around 1e-6 survive fp16 only as a few subnormal steps."""
    expected = np.random.default_rng(0).standard_normal((4, 10)).astype(np.float32) * 1e-6
    served = expected.astype(np.float16).astype(np.float32)
    assert np.any(served)
    check = check_outputs(expected, served, Tolerance("class_scores"), "fp16", "logits")
    assert not check.ok
    assert any("below fp16's smallest normal number" in p for p in check.problems)


def test_no_absolute_floor_under_tiny_outputs() -> None:
    """Errors of 10% on an output whose values are ~1e-8 are 10% errors, not 1e-8 ones."""
    expected = np.linspace(1e-8, 2e-8, 12, dtype=np.float32).reshape(3, 4)
    check = check_outputs(expected, expected * 1.1, None, "fp32", "y")
    assert check.max_rel_error == pytest.approx(0.1, rel=1e-3)
    assert not check.ok and "max relative error" in check.problems[0]


def _near_tie_scores() -> tuple[np.ndarray, np.ndarray]:
    """Class scores whose top two differ by 1% of the scale: swapped, every value moves by 1%, within
    fp16's max_rel (2%), yet the served class is another one."""
    expected = np.array([[1.0, 0.99, 0.2, -0.5], [0.1, 0.3, 1.0, 0.985]], dtype=np.float32)
    served = expected.copy()
    served[0, :2] = served[0, 1::-1]
    return expected, served


def test_a_classifier_output_with_a_wrong_argmax_fails() -> None:
    expected, served = _near_tie_scores()
    assert check_outputs(expected, served, None, "fp16", "scores").ok  # values alone: within 2e-2
    check = check_outputs(expected, served, Tolerance("class_scores"), "fp16", "scores")
    assert check.top1_agreement == 0.5 and check.problems == ("top-1 agreement 0.500 is below 1",)
    # Scores the dtype cannot order (within fp16's resolution of each other) are no disagreement.
    tie = np.array([[1.0, 1.0 - 2e-4, 0.0]], dtype=np.float32)
    assert check_outputs(tie, tie[:, [1, 0, 2]], Tolerance("class_scores"), "fp16", "s").top1_agreement == 1.0


def test_embeddings_are_held_to_cosine_and_given_limits_replace_defaults() -> None:
    expected = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    turned = expected.copy()
    turned[:, 0] += 0.05  # small in max_rel terms, but a direction change cosine sees at fp32
    assert resolved(Tolerance("embedding"), "fp32").cosine == 0.99999
    check = check_outputs(expected, turned, Tolerance("embedding", max_rel=0.1), "fp32", "embedding")
    assert check.min_cosine < 0.99999 and [p.startswith("min cosine") for p in check.problems] == [True]
    assert not check_outputs(expected, expected + 1e-3, Tolerance(max_abs=1e-4, max_rel=1.0), "fp32").ok


def test_tolerance_in_the_spec_is_checked_and_recorded(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"models\[0\].outputs\[0\].tolerance.top1: must be a share"):
        _classifier(tolerance={"kind": "class_scores", "top1": 1.5})
    with pytest.raises(SpecError, match=r"models\[0\].outputs\[0\].tolerance.kind: must be one of"):
        _classifier(tolerance={"kind": "probabilities"})
    with pytest.raises(SpecError, match=r"inputs\[0\].tolerance: tolerances are for outputs only"):
        parse_spec({"models": [{
            "name": "m", "source": "trivial", "max_batch_size": 2,
            "inputs": [{"name": "x", "dtype": "fp32", "shape": [16], "tolerance": {"max_rel": 0.1}}],
            "outputs": [{"name": "y", "dtype": "fp32", "shape": [16]}]}]})  # fmt: skip
    spec = _classifier(scale=1.0, tolerance={"kind": "class_scores", "max_rel": 1e-3})
    artifact = export_onnx(spec, tmp_path)
    record = json.loads((tmp_path / "export.json").read_text())
    (logits,) = record["outputs"]
    assert logits["name"] == "logits" and logits["problems"] == []
    assert logits["tolerance"] == {"kind": "class_scores", "max_rel": 1e-3, "top1": 1.0}
    assert logits["top1_agreement"] == 1.0 and logits["max_rel_error"] == artifact.max_rel_error


def test_infer_check_applies_the_spec_tolerances() -> None:
    expected, served = _near_tie_scores()
    entry = {
        "name": "clf", "source": "trivial", "max_batch_size": 2, "precision": "fp16",
        "inputs": [{"name": "x", "dtype": "fp16", "shape": [4]}],
        "outputs": [{"name": "scores", "dtype": "fp16", "shape": [4], "tolerance": {"kind": "class_scores"}}],
    }  # fmt: skip
    spec = parse_spec({"models": [entry]}).model("clf")
    reference = Reference(spec, {}, {"scores": expected}, "fp16")
    with pytest.raises(MismatchError, match=r"scores: top-1 agreement 0\.500 is below 1"):
        reference.compare({"scores": served}, "clf served")
    assert reference.compare({"scores": expected.astype(np.float16)}, "clf served").ok
