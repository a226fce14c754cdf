"""What ``make tune`` and ``make plan`` must do with the runs they got, on a real server whose timing a
busy host decides: answer (exit 0) with a point a run held the budget at, or say nothing meets (exit 3)
naming a closest run over the budget, never one within it. Tests of the real server assert this, not
which of the two a host's load gives; the outcome itself is asserted on scripted servers
(tests/unit/perf/tune/test_tuner_evidence.py, tests/unit/perf/plan/test_verify.py)."""

from __future__ import annotations

import math
import re
from pathlib import Path

from perf.plan.document import PlanDocument
from perf.saved import load_document
from perf.tune.result import TuneDocument, load

VERDICT = re.compile(
    r"nothing meets p99 <= ([\d.]+) ms [^:]*: the closest measured was .+? at [\d,.]+/s (.*)"
)


def over_the_budget(verdict: str, budget_ms: float) -> None:
    """``verdict`` names a closest run that missed the budget: p99 over it, or behind the offered rate
    (``serving only``), or requests that failed, or no request answered."""
    found = VERDICT.search(verdict)
    assert found, verdict
    figure = found[2]
    p99 = re.match(r"with p99 ([\d.,]+) ms", figure)
    assert (
        (p99 and float(p99[1].replace(",", "")) > budget_ms)
        or "serving only" in figure
        or re.search(r"\d requests? failed", figure)
        or ("no request was answered" in figure)
    ), verdict


def tune_outcome(code: int, folder: Path, budget_ms: float) -> TuneDocument | None:
    """The saved result where ``make tune`` answered, its answer held by its own runs; None where it
    said nothing meets, with a closest run over the budget and no spec written."""
    assert code in (0, 3), code
    if code == 3:
        partial = (folder / "partial.md").read_text()
        assert partial.startswith("# ") and ": no answer" in partial.splitlines()[0]
        over_the_budget(partial, budget_ms)
        assert not (folder / "spec.tuned.yaml").exists()
        return None
    saved = load(folder)
    operating = saved.operating
    assert operating.verdict == "holds" and operating.measured is not None, operating
    assert saved.measured_max_rate >= saved.operating_rate > 0
    # the point holds by the rule: more of its runs met the budget than missed; its last run is one
    # of them, and the answer is one a run met the budget at
    assert operating.runs >= 1
    held = [p for p in saved.verification if p.config == saved.chosen and p.verdict == "holds"]
    assert any(p.rate == saved.operating_rate for p in held)
    return saved


def plan_outcome(code: int, folder: Path, budget_ms: float) -> PlanDocument:
    """``plan.json`` of a CPU plan: an answer at a rate a point held the budget at, or the verdict."""
    assert code in (0, 3), code
    saved = load_document(folder / "plan.json", PlanDocument)
    rows = saved.verification
    if code == 3:
        assert saved.verdict and not saved.overlay_written and not (folder / "spec.planned.yaml").exists()
        over_the_budget(saved.verdict, budget_ms)
        assert not any(r.verdict == "holds" for r in rows)
        return saved
    assert saved.verdict is None and saved.measured_rate is not None
    held = [r for r in rows if r.strategy == saved.chosen.label and r.verdict == "holds"]
    assert held and saved.measured_rate == max(r.rate for r in held)
    assert saved.measured_rate == max(r.rate for r in rows if r.verdict == "holds")  # the best point
    assert all(math.isfinite(r.rate) for r in rows)
    return saved
