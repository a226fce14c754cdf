"""Numerical parity of an exported or served model with its fp32 source: one check for every artifact
and every ``client infer --check``, so a model is held to the same limits built and served. The figures
(``max_rel`` without floor, collapse, ``top1``, ``cosine``, ``max_abs``) and their defaults by kind and
precision are in docs/SPEC.md."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from exporters.errors import ExportCheckError
from exporters.schema.sections import Tolerance

# Relative to the reference's largest magnitude: fp32 to float rounding, fp16 ~3 digits, bf16 (pipeline
# boundaries) ~2; int8's limits are measured (docs/SPEC.md) and hold the answer's shape more than digits.
MAX_REL = {"fp32": 1e-4, "fp16": 2e-2, "bf16": 5e-2, "int8": 0.1}
COSINE = {"fp32": 0.99999, "fp16": 0.999, "bf16": 0.99, "int8": 0.99}  # embeddings
# class scores: every row's argmax agrees (ties within the dtype's resolution excepted), but for int8.
TOP1 = {"fp32": 1.0, "fp16": 1.0, "bf16": 1.0, "int8": 0.95}
# Each precision's smallest normal number and resolution (int8 models give fp32 outputs at 8 bits).
SMALLEST_NORMAL = {"fp32": float(np.finfo(np.float32).tiny), "fp16": float(np.finfo(np.float16).tiny),
                   "bf16": 2.0**-126, "int8": float(np.finfo(np.float32).tiny)}  # fmt: skip
EPSILON = {"fp32": float(np.finfo(np.float32).eps), "fp16": float(np.finfo(np.float16).eps), "bf16": 2.0**-7,
           "int8": 2.0**-7}  # fmt: skip
FLUSHED_SHARE = 0.5  # more than this share of the reference's nonzero values served as 0: collapsed


def resolved(tolerance: Tolerance | None, precision: str) -> Tolerance:
    """``tolerance`` with every limit its kind uses filled in from the precision's defaults."""
    given = tolerance or Tolerance()
    return dataclasses.replace(
        given,
        max_rel=given.max_rel if given.max_rel is not None else MAX_REL[precision],
        cosine=given.cosine if given.cosine is not None or given.kind != "embedding" else COSINE[precision],
        top1=given.top1 if given.top1 is not None or given.kind != "class_scores" else TOP1[precision],
    )


@dataclass(frozen=True)
class OutputCheck:
    """One output against its reference: the figures, the limits they were held to, what failed."""

    name: str
    precision: str
    tolerance: Tolerance  # resolved: every limit that applied
    max_abs_error: float
    max_rel_error: float
    scale: float  # the reference's largest magnitude (what max_rel divides by)
    min_cosine: float | None = None
    top1_agreement: float | None = None
    problems: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        limit = self.tolerance
        parts = [
            f"max rel {self.max_rel_error:.3g} (≤ {limit.max_rel:g})",
            f"max abs {self.max_abs_error:.3g}",
        ]
        if limit.max_abs is not None:
            parts[-1] += f" (≤ {limit.max_abs:g})"
        if self.min_cosine is not None:
            parts.append(f"min cosine {self.min_cosine:.6f} (≥ {self.tolerance.cosine:g})")
        if self.top1_agreement is not None:
            parts.append(f"top-1 agreement {self.top1_agreement:.3f} (≥ {self.tolerance.top1:g})")
        return f"{self.name}: {', '.join(parts)}"

    def record(self) -> dict:
        """The figures and limits as ``export.json`` keeps them."""
        data = dataclasses.asdict(self)
        data["tolerance"] = {k: v for k, v in data["tolerance"].items() if v is not None}
        data["problems"] = list(self.problems)
        return data


def _min_cosine(actual: np.ndarray, expected: np.ndarray) -> float:
    a, e = (x.reshape(x.shape[0], -1) if x.ndim > 1 else x.reshape(1, -1) for x in (actual, expected))
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(e, axis=1)
    dots = (a * e).sum(axis=1)
    both_zero = (np.linalg.norm(a, axis=1) == 0) & (np.linalg.norm(e, axis=1) == 0)
    cosine = np.where(both_zero, 1.0, np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0))
    return float(cosine.min(initial=1.0))


def _top1_agreement(actual: np.ndarray, expected: np.ndarray, precision: str) -> float:
    """Share of rows whose argmax agrees, or picks classes within the dtype's resolution of each other."""
    a, e = (x.reshape(-1, x.shape[-1]) if x.ndim > 1 else x.reshape(1, -1) for x in (actual, expected))
    if a.shape[0] == 0 or a.shape[1] == 0:
        return 1.0
    picked, truth = a.argmax(axis=1), e.argmax(axis=1)
    rows = np.arange(e.shape[0])
    best = e[rows, truth]
    resolution = EPSILON[precision] * np.maximum(np.abs(e).max(axis=1), SMALLEST_NORMAL[precision])
    agree = (picked == truth) | (best - e[rows, picked] <= resolution)
    return float(agree.mean())


def _collapse(actual: np.ndarray, expected: np.ndarray, scale: float, precision: str) -> list[str]:
    """Why the output cannot be the reference in this precision whatever its differences, if it cannot."""
    if scale == 0.0:
        return []
    if not np.any(actual):
        return [f"collapsed: every value is 0 where the reference reaches {scale:.3g}"]
    problems = []
    if scale < SMALLEST_NORMAL[precision]:
        problems.append(
            f"collapsed: the reference's largest magnitude {scale:.3g} is below {precision}'s smallest "
            f"normal number {SMALLEST_NORMAL[precision]:.3g}, so {precision} cannot carry it (scale the "
            "output, or serve fp32)"
        )
    nonzero = expected != 0
    flushed = int(np.count_nonzero(nonzero & (actual == 0)))
    if flushed > FLUSHED_SHARE * int(np.count_nonzero(nonzero)):
        problems.append(
            f"collapsed: {flushed} of {int(np.count_nonzero(nonzero))} nonzero values flushed to 0"
        )
    return problems


def check_outputs(
    expected: np.ndarray, actual: np.ndarray, tolerance: Tolerance | None, precision: str,
    name: str = "output",
) -> OutputCheck:  # fmt: skip
    """One output held to ``tolerance`` (resolved for ``precision``); never raises: ``problems`` say why."""
    limits = resolved(tolerance, precision)
    if actual.shape != expected.shape:
        problem = f"shape {list(actual.shape)}, the reference has {list(expected.shape)}"
        return OutputCheck(name, precision, limits, np.inf, np.inf, 0.0, problems=(problem,))
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    problems = []
    finite = np.isfinite(e)
    if np.any(~np.isfinite(a) & finite):
        problems.append(f"{int(np.count_nonzero(~np.isfinite(a) & finite))} values are NaN or ±Inf")
    a, e = np.where(finite, a, 0.0), np.where(finite, e, 0.0)
    a = np.where(np.isfinite(a), a, 0.0)
    diff = float(np.max(np.abs(a - e), initial=0.0))
    scale = float(np.max(np.abs(e), initial=0.0))
    rel = diff / scale if scale > 0 else (0.0 if diff == 0 else np.inf)
    problems += _collapse(a, e, scale, precision)
    if rel > limits.max_rel:
        problems.append(f"max relative error {rel:.3g} (max abs {diff:.3g}) exceeds {limits.max_rel:g}")
    if limits.max_abs is not None and diff > limits.max_abs:
        problems.append(f"max abs error {diff:.3g} exceeds {limits.max_abs:g}")
    cosine = _min_cosine(a, e) if limits.cosine is not None else None
    if cosine is not None and cosine < limits.cosine:
        problems.append(f"min cosine {cosine:.6f} is below {limits.cosine:g}")
    top1 = _top1_agreement(a, e, precision) if limits.top1 is not None else None
    if top1 is not None and top1 < limits.top1:
        problems.append(f"top-1 agreement {top1:.3f} is below {limits.top1:g}")
    return OutputCheck(name, precision, limits, diff, rel, scale, cosine, top1, tuple(problems))


@dataclass(frozen=True)
class ParityReport:
    """Every output's check; the worst figures over them for one-line summaries."""

    checks: tuple[OutputCheck, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def max_abs_error(self) -> float:
        return max((c.max_abs_error for c in self.checks), default=0.0)

    @property
    def max_rel_error(self) -> float:
        return max((c.max_rel_error for c in self.checks), default=0.0)

    @property
    def tolerance(self) -> float:
        """The tightest ``max_rel`` any output was held to."""
        return min((c.tolerance.max_rel or 0.0 for c in self.checks), default=0.0)


def worst_of(reports: Sequence[ParityReport]) -> ParityReport:
    """Per output, the check with the largest relative error over several batches (a failed one first;
    among equals, the latest)."""
    per_output = zip(*(report.checks for report in reversed(reports)), strict=True)
    return ParityReport(
        tuple(max(checks, key=lambda c: (not c.ok, c.max_rel_error)) for checks in per_output)
    )


def compare_outputs(
    actual: Sequence[np.ndarray], expected: Sequence[np.ndarray], precision: str, what: str,
    names: Sequence[str] | None = None, tolerances: Sequence[Tolerance | None] | None = None,
) -> ParityReport:  # fmt: skip
    """Check every output; ``ExportCheckError`` naming ``what``, the output and each broken limit."""
    if len(actual) != len(expected):
        raise ExportCheckError(f"{what}: {len(actual)} outputs, torch gives {len(expected)}")
    names = list(names) if names is not None else [f"output {i}" for i in range(len(expected))]
    limits = list(tolerances) if tolerances is not None else [None] * len(expected)
    outputs = zip(actual, expected, limits, names, strict=True)
    report = ParityReport(tuple(check_outputs(e, a, t, precision, n) for a, e, t, n in outputs))
    failed = [c for c in report.checks if not c.ok]
    if failed:
        raise ExportCheckError(
            f"{what} does not reproduce its fp32 source: "
            + "; ".join(f"{c.name}: {', '.join(c.problems)}" for c in failed)
        )
    return report
