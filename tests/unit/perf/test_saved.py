"""Saved documents round-trip through their dataclasses, and a wrong file is refused naming the field."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from perf.errors import OptionError
from perf.saved import load_document, save_document


@dataclass(frozen=True)
class Figure:
    rate: float
    p99_ms: float | None = None


@dataclass(frozen=True)
class Saved:
    model: str
    operating: Figure
    points: tuple[Figure, ...] = ()
    batches: dict[str, int] = field(default_factory=dict)


def test_a_document_reads_back_as_written_non_finite_figures_included(tmp_path: Path) -> None:
    saved = Saved("recommender", Figure(math.inf), (Figure(10.0, 2.5), Figure(20.0)), {"8": 3})
    back = load_document(save_document(tmp_path / "result.json", saved), Saved)
    assert back.model == "recommender" and math.isinf(back.operating.rate)
    assert back.points == saved.points and back.batches == {"8": 3}


def test_a_field_of_the_wrong_type_is_named(tmp_path: Path) -> None:
    path = tmp_path / "result.json"
    path.write_text('{"model": "m", "operating": {"rate": "fast"}}')
    with pytest.raises(OptionError, match=r"not a Saved document: operating\.rate"):
        load_document(path, Saved)


def test_a_missing_field_and_a_missing_file_are_named(tmp_path: Path) -> None:
    path = tmp_path / "result.json"
    path.write_text('{"operating": {"rate": 1}}')
    with pytest.raises(OptionError, match="model: Field required"):
        load_document(path, Saved)
    with pytest.raises(OptionError, match="no such file"):
        load_document(tmp_path / "absent.json", Saved)
