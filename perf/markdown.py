"""The markdown every perf report is written with: number formatting, tables, and the one writer."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any


def number(value: float, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def ratio(value: float) -> str:
    return "–" if value is None or math.isnan(value) else f"{value:.2f}×"


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def write_report(
    path: Path, lines: Sequence[str], figures: Any = None, figures_path: Path | None = None
) -> Path:
    """Write a report: ``figures`` as JSON first (``figures_path``, by default ``path`` with ``.json``),
    so every number survives a render that fails, then the markdown ``lines`` at ``path``."""
    if figures is not None:
        target = figures_path or path.with_suffix(".json")
        target.write_text(json.dumps(figures, indent=1, default=plain))
    path.write_text("\n".join(lines) + "\n")
    return path


def plain(value: object) -> object:
    """What ``json`` cannot write itself: a dataclass as a dict, a numpy scalar as its value."""
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    return value.item() if hasattr(value, "item") else str(value)
