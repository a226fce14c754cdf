"""Buckets only where padding is harmless (``perf.measure.bucket_runs``), on real exports of two
factories: the Conv1d+GRU, whose state moves when a sequence is padded (no bucket set offered, the
report names the length, the padding and by how much), and a masked mean over frames, whose mask
input is padded with zeros (every bucket set offered). No server: the checks run the served ONNX file."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from exporters.onnx_export import export_onnx
from exporters.schema.models import ModelSpec, parse_model
from perf.measure.bucket_runs import offered_ways, refused_lines
from perf.measure.shapes import bucket_ways, resized, shape_mix

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "data" / "own_factories"))
from entries import gru_entry, masked_entry

GRU, MASKED = gru_entry("gru", 4), masked_entry("masked", 4)


def _exported(entry: dict, folder: Path) -> tuple[ModelSpec, Path]:
    spec = parse_model(entry, "models[0]")
    return spec, export_onnx(spec, folder).path


def test_no_bucket_set_is_offered_for_a_model_whose_answer_padding_changes(tmp_path: Path) -> None:
    spec, onnx_file = _exported(GRU, tmp_path)
    ways = bucket_ways(spec)
    assert len(ways) >= 3  # exact lengths and two bucket sets at the traffic's quantiles
    offered, refused = offered_ways(ways, onnx_file, spec, shape_mix(spec))
    assert offered == {"exact lengths": ()} and set(refused) == set(ways) - {"exact lengths"}
    verdict = refused["2 buckets"]
    assert not verdict.harmless and verdict.buckets == ways["2 buckets"]
    assert verdict.detail.startswith("padding changes the answer: length ")
    assert "state moved by up to" in verdict.detail and "the spec's tolerance 0.0001" in verdict.detail
    (line,) = refused_lines(refused)
    assert line.startswith("Not offered, not measured") and f"2 buckets {list(ways['2 buckets'])}" in line


def test_every_bucket_set_is_offered_where_a_mask_makes_padding_harmless(tmp_path: Path) -> None:
    spec, onnx_file = _exported(MASKED, tmp_path)
    ways = bucket_ways(spec)
    offered, refused = offered_ways(ways, onnx_file, spec, shape_mix(spec))
    assert offered == ways and refused == {} and refused_lines(refused) == []


def test_a_mask_is_padded_with_zeros_and_other_inputs_with_their_last_position() -> None:
    spec = parse_model(MASKED, "models[0]")
    arrays = {
        "frames": np.arange(2 * 3 * 16, dtype=np.float32).reshape(2, 3, 16),
        "mask": np.ones((2, 3), np.int64),
    }
    padded = resized(spec, arrays, 5)
    assert padded["mask"].tolist() == [[1, 1, 1, 0, 0]] * 2
    assert np.array_equal(padded["frames"][:, 4], arrays["frames"][:, 2])


@pytest.mark.parametrize("entry", [GRU, MASKED])
def test_exact_lengths_are_always_offered(entry: dict, tmp_path: Path) -> None:
    spec, onnx_file = _exported(entry, tmp_path)
    offered, _ = offered_ways({"exact lengths": ()}, onnx_file, spec, shape_mix(spec))
    assert offered == {"exact lengths": ()}
