"""The markdown every perf report is written with: number formatting, tables, and the one writer."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

from perf.unmeasured import unmeasured_text, why_unmeasured


def number(value: float | None, digits: int = 1, signed: bool = False, unit: str = "") -> str:
    """A figure as the reports print it, followed by ``unit``; "could not be measured: <why>" (no unit)
    for NaN, infinity, an ``Unmeasured`` value, and a negative one unless ``signed``
    (``perf.unmeasured``)."""
    why = why_unmeasured(value, signed)
    if why is not None:
        return unmeasured_text(why)
    return f"{value:,.0f}{unit}" if abs(value) >= 1000 else f"{value:.{digits}f}{unit}"


def ratio(value: float | None, signed: bool = False) -> str:
    """``value`` as ``1.23×``; not a figure as ``number`` says."""
    why = why_unmeasured(value, signed)
    return unmeasured_text(why) if why is not None else f"{value:.2f}×"


def percent(value: float | None) -> str:
    """A change or an error in percent, signed (``+12%``); NaN and infinity as ``number`` says."""
    why = why_unmeasured(value, signed=True)
    return unmeasured_text(why) if why is not None else f"{value:+.0f}%"


def fit_text(fit: Any, digits: int = 3) -> str:
    """``T = …, Δt = …, R² = …`` of a ``perf.model.latency.LatencyFit``; a term below zero is no
    figure, and the report says so (``LatencyFit.flaw`` says why)."""
    return (
        f"T = {number(fit.t_ms, digits, unit=' ms')}, Δt = {number(fit.dt_ms, digits + 1, unit=' ms')}, "
        f"R² = {number(fit.r2, 3)}"
    )


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
