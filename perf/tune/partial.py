"""What a tune that failed part-way leaves behind: the error, and every run measured before it.

Minutes of measuring are not thrown away with a traceback: ``partial.md`` in the report folder says what
went wrong and lists each run (configuration and rate, what was served, p99, the batches formed, the
windows' length), so the user sees how far the tuner got and why it stopped.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from perf.errors import NothingMeetsError
from perf.markdown import number, table
from perf.measure.measurement import Measurement


def write_partial(folder: Path, title: str, error: BaseException, runs: Sequence[Measurement]) -> Path:
    """Write ``partial.md`` into ``folder``: ``error`` and ``runs`` (in the order measured)."""
    rows = [
        [
            run.label, number(run.load.rate, 0) if run.load.rate else "–", number(run.throughput, 0),
            number(run.p99_ms), number(run.stats.mean_batch), number(run.windows[0][1] - run.windows[0][0])
            if run.windows else "–",
        ]
        for run in runs
    ]  # fmt: skip
    header = ["run", "offered /s", "served /s", "p99 ms", "mean batch", "window s"]
    if isinstance(error, NothingMeetsError):  # a verdict, not a failure: still no answer to use
        head = [
            f"# {title}: no answer",
            "",
            f"**{error.verdict}**.",
            *(["", error.detail] if error.detail else []),
        ]
        head += ["", "Nothing below is an answer: no `spec.tuned.yaml` was written."]
    else:
        head = [f"# {title}: stopped before the pick", "", f"**{type(error).__name__}**: {error}"]
    lines = [
        *head,
        "",
        f"{len(runs)} runs were measured before it:" if runs else "No run was measured before it.",
        "",
        table(header, rows) if rows else "",
        "",
        "`tune.log` in this folder has every step; `perf_analyzer.log` (if present) each of its runs.",
    ]
    path = folder / "partial.md"
    path.write_text("\n".join(lines) + "\n")
    return path
