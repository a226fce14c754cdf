"""A figure that could not be measured, and why: a NaN that carries its reason to the report, where
``perf.markdown`` prints "could not be measured: <why>" instead of a claim the run did not make (a NaN,
an infinity, or a negative time or rate from a noisy fit)."""

from __future__ import annotations

import math

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
    """Why ``value`` is not a figure to print (None: it is one). ``signed``: a figure that may be
    negative (a change, an error in percent)."""
    if value is None:
        return NO_VALUE
    if isinstance(value, Unmeasured):
        return value.why or NO_VALUE
    if math.isnan(value):
        return NO_VALUE
    if math.isinf(value):
        return INFINITE
    if value < 0 and not signed:
        return NEGATIVE
    return None


def unmeasured_text(why: str) -> str:
    """The words a report shows in place of a figure."""
    return f"{UNMEASURED}: {why}"


def error_percent(predicted: float, measured: float | None) -> float:
    """How far ``predicted`` is from ``measured``, in percent of ``measured`` (signed); NaN where either
    side is no figure (a prediction below zero is a model's noise, not an error of some size)."""
    if not measured or why_unmeasured(predicted) or why_unmeasured(measured):
        return math.nan
    return 100 * (predicted - measured) / measured
