"""Numerical parity between an exported artifact and the torch model it came from."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from exporters.errors import ExportCheckError

# Relative to the largest reference magnitude: fp32 should agree to float rounding, fp16 to ~3 digits;
# bf16 (pipeline boundaries only) keeps 8 mantissa bits, about 2 digits.
TOLERANCES = {"fp32": 1e-4, "fp16": 2e-2, "bf16": 5e-2}


@dataclass(frozen=True)
class ParityReport:
    max_abs_error: float
    max_rel_error: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.max_rel_error <= self.tolerance


def compare_outputs(
    actual: Sequence[np.ndarray], expected: Sequence[np.ndarray], precision: str, what: str
) -> ParityReport:
    """Compare output lists; raise ``ExportCheckError`` naming ``what`` when outside the tolerance.

    The relative error is ``max|a - e| / max|e|`` per output (the worst output counts), which stays
    meaningful for probabilities near zero where an element-wise ratio explodes.
    """
    if len(actual) != len(expected):
        raise ExportCheckError(f"{what}: {len(actual)} outputs, torch gives {len(expected)}")
    worst_abs, worst_rel = 0.0, 0.0
    for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
        if a.shape != e.shape:
            raise ExportCheckError(f"{what}: output {index} has shape {a.shape}, torch gives {e.shape}")
        diff = float(np.max(np.abs(a.astype(np.float64) - e.astype(np.float64)), initial=0.0))
        scale = max(float(np.max(np.abs(e.astype(np.float64)), initial=0.0)), 1e-6)
        worst_abs, worst_rel = max(worst_abs, diff), max(worst_rel, diff / scale)
    report = ParityReport(worst_abs, worst_rel, TOLERANCES[precision])
    if not report.ok:
        raise ExportCheckError(
            f"{what}: max relative error {worst_rel:.3g} (max abs {worst_abs:.3g}) exceeds the {precision} "
            f"tolerance {report.tolerance:g}"
        )
    return report
