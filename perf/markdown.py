"""The markdown every perf report is written with: a figure that could not be measured is a NaN with its
reason (``Unmeasured``), printed as "could not be measured: <why>", never as a claim the run did not make."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, is_dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

UNMEASURED = "could not be measured"
NO_VALUE = "no value in this run"
NEGATIVE = "came out negative (noise larger than the effect)"
INFINITE = "came out infinite (nothing measured to divide by)"


class Unmeasured(float):
    """NaN with the reason it is not a figure (``why``); a float, so whatever takes figures takes it."""

    why: str

    def __new__(cls, why: str = "") -> Unmeasured:
        value = super().__new__(cls, math.nan)
        value.why = why if isinstance(why, str) else ""  # a copy rebuilds from the float, then the state
        return value

    def __repr__(self) -> str:
        return f"Unmeasured({self.why!r})"


def why_unmeasured(value: float | None, signed: bool = False) -> str | None:
    """Why ``value`` is not a figure to print (None: it is one); ``signed``: it may be negative (a change)."""
    if isinstance(value, Unmeasured) and value.why:
        return value.why
    if value is None or math.isnan(value):
        return NO_VALUE
    if math.isinf(value):
        return INFINITE
    return NEGATIVE if value < 0 and not signed else None


def error_percent(predicted: float, measured: float | None) -> float:
    """How far ``predicted`` is from ``measured``, in percent of ``measured`` (signed); NaN where either
    side is no figure (a prediction below zero is a model's noise, not an error of some size)."""
    if not measured or why_unmeasured(predicted) or why_unmeasured(measured):
        return math.nan
    return 100 * (predicted - measured) / measured


def number(value: float | None, digits: int = 1, signed: bool = False, unit: str = "") -> str:
    """A figure as the reports print it, followed by ``unit``; "could not be measured: <why>" (no unit)
    for NaN, infinity, an ``Unmeasured`` value, and a negative one unless ``signed``."""
    why = why_unmeasured(value, signed)
    if why is not None:
        return f"{UNMEASURED}: {why}"
    return f"{value:,.0f}{unit}" if abs(value) >= 1000 else f"{value:.{digits}f}{unit}"


def ratio(value: float | None, signed: bool = False) -> str:
    """``value`` as ``1.23×``; not a figure as ``number`` says."""
    why = why_unmeasured(value, signed)
    return f"{UNMEASURED}: {why}" if why is not None else f"{value:.2f}×"


def percent(value: float | None) -> str:
    """A change or an error in percent, signed (``+12%``); NaN and infinity as ``number`` says."""
    why = why_unmeasured(value, signed=True)
    return f"{UNMEASURED}: {why}" if why is not None else f"{value:+.0f}%"


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
    """``figures`` as JSON first (default ``path`` with ``.json``): they survive a failing render."""
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


LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


def report_folder(reports: Path, kind: str = "", log_name: str | None = None) -> Path:
    """A new ``reports/<timestamp>[-<kind>]``, earlier reports kept; ``log_name``: where the INFO log goes."""
    folder = reports / (datetime.now().strftime("%Y%m%d-%H%M%S") + (f"-{kind}" if kind else ""))
    folder.mkdir(parents=True, exist_ok=True)
    if log_name is not None:
        logging.basicConfig(level=logging.INFO, filename=folder / log_name, format=LOG_FORMAT)
    return folder
