"""perf_analyzer as an independent witness for our load generator, side by side on the same server.

Same model, same configuration (the one loaded), same concurrency, runs interleaved: perf_analyzer,
our generator in one process, our generator in several processes. Where the single process falls more
than 10% behind perf_analyzer and several processes close the gap, the client was the bottleneck; the
tuner's figures come from the multi-process engine for that reason (the report says which engine
produced each figure).
"""

from __future__ import annotations

import logging
from pathlib import Path

from perf.analyzer import find_perf_analyzer, run_perf_analyzer
from perf.markdown import number, table
from perf.perf_analyzer_install import unavailable_reason
from perf.tune.engine import LoadEngine
from perf.tune.session import TuneSession

log = logging.getLogger(__name__)


def side_by_side(
    session: TuneSession, folder: Path, console, concurrency: int = 16, seconds: float = 3.0, rounds: int = 2
) -> dict:
    """Rows and figures of perf_analyzer vs our engines at ``concurrency`` (closed loop)."""
    binary = find_perf_analyzer()
    if binary is None:
        reason = unavailable_reason() or "not installed (run `make perf-analyzer`)"
        note = f"perf_analyzer did not run: {reason}"
        return {
            "sections": ["", "## perf_analyzer vs our generator", "", note],
            "figures": {"perf_analyzer": note},
        }
    console.print(f"  perf_analyzer vs our generator at concurrency {concurrency}")
    assert session.server is not None
    url = session.server.grpc_url if session.protocol == "grpc" else session.server.http_url
    rows, figures, settings = [], {}, ""
    single = LoadEngine(1)
    for round_index in range(rounds):
        try:
            theirs = run_perf_analyzer(
                binary,
                session.base.name,
                url,
                session.protocol,
                concurrency,
                int(seconds * 1000),
                folder,
                session.target.inputs,
            )
        except (RuntimeError, OSError, ValueError, StopIteration) as error:
            log.exception("perf_analyzer failed")
            note = f"perf_analyzer failed: {error}"
            return {
                "sections": ["", "## perf_analyzer vs our generator", "", note],
                "figures": {"perf_analyzer": note},
            }
        rows.append(
            ["perf_analyzer 2.41.0", round_index + 1, number(theirs.throughput, 0), number(theirs.p99_ms, 2)]
        )
        figures.setdefault("perf_analyzer", []).append([theirs.throughput, theirs.p99_ms])
        settings = theirs.settings_text
        for engine in (single, session.engine):
            session.engine, keep = engine, session.engine
            try:
                run = session.closed_loop(concurrency, seconds, f"{engine.name} c={concurrency}")
            finally:
                session.engine = keep
            rows.append([engine.name, round_index + 1, number(run.throughput, 0), number(run.p99_ms, 2)])
            figures.setdefault(engine.name, []).append([run.throughput, run.p99_ms])
    config = session.current.label if session.current else "?"
    section = [
        "",
        f"## perf_analyzer vs our generator (closed loop, concurrency {concurrency}, {config}, gRPC)",
        "",
        table(["engine", "round", "inf/s", "p99 ms"], rows),
        "",
        _verdict(figures),
        "",
        f"perf_analyzer settings: `{settings}`.",
    ]
    return {"sections": section, "figures": {"side_by_side": figures, "perf_analyzer_settings": settings}}


def _verdict(figures: dict[str, list[list[float]]]) -> str:
    def mean(name: str) -> float:
        values = [v[0] for v in figures.get(name, [])]
        return sum(values) / len(values) if values else 0.0

    theirs = mean("perf_analyzer")
    lines = []
    for name in figures:
        if name == "perf_analyzer" or not theirs:
            continue
        gap = mean(name) / theirs - 1
        lines.append(
            f"{name}: {100 * gap:+.0f}% vs perf_analyzer"
            + (" (more than 10% apart)" if abs(gap) > 0.1 else "")
        )
    return "; ".join(lines) + "."
