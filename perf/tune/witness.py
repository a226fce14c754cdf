"""perf_analyzer as an independent witness for our load generator, side by side on the same server.

Same model, same configuration (the one loaded), same concurrency, runs interleaved: perf_analyzer as
the load engine (one run gives two rows: its own CSV figure, and our records built from its per-request
export, which must agree with the CSV within a few % or our record-building is wrong), then our
generator in one process and in several. Where the single process falls more than 10% behind
perf_analyzer and several processes close the gap, the client was the bottleneck; ``--engine
perf_analyzer`` removes it (the report says which engine produced each figure). Each run's CPU per
request, the server's and the rest of the machine's (the client, mostly), says why where they do not:
on cores the client shares with the server, a client that costs more CPU per request leaves the
server less.
"""

from __future__ import annotations

import logging
from contextlib import ExitStack
from pathlib import Path

from perf.analyzer import find_perf_analyzer
from perf.errors import StudyError
from perf.markdown import number, table
from perf.perf_analyzer_install import unavailable_reason
from perf.tune.engine import Engine, LoadEngine
from perf.tune.pa_engine import PerfAnalyzerEngine
from perf.tune.session import TuneSession

log = logging.getLogger(__name__)
CSV_ROW = "perf_analyzer (its own CSV)"
HEADING = "## perf_analyzer vs our generator"
CPU_COLUMNS = ("server CPU ms/request", "the rest of the machine's CPU ms/request (the client, mostly)")


def _row(name: str, round_index: int, throughput: float, p99_ms: float, *cpu_ms: float) -> list[str | int]:
    """One row of the table: engine, round (from 1), inf/s, p99 and the two CPU figures ("–" without)."""
    cpu = [number(value, 3) for value in cpu_ms] or ["–", "–"]
    return [name, round_index + 1, number(throughput, 0), number(p99_ms, 2), *cpu]


def _note(text: str) -> dict:
    return {"sections": ["", HEADING, "", text], "figures": {"perf_analyzer": text}}


def _engines(session: TuneSession, stack: ExitStack) -> list[Engine]:
    """perf_analyzer's engine, ours with 1 process and ours with several (the session's own when it is
    one of them, so the tuner's engine is among those compared)."""
    current = session.engine
    analyzer = (
        current if isinstance(current, PerfAnalyzerEngine) else stack.enter_context(PerfAnalyzerEngine())
    )
    processes = current.processes if isinstance(current, LoadEngine) and current.processes > 1 else 2
    several = current if isinstance(current, LoadEngine) and current.processes > 1 else LoadEngine(processes)
    if several is not current:
        stack.enter_context(several)
    return [analyzer, stack.enter_context(LoadEngine(1)), several]


def side_by_side(
    session: TuneSession, folder: Path, console, concurrency: int = 16, seconds: float = 3.0, rounds: int = 2
) -> dict:
    """Rows and figures of perf_analyzer vs our engines at ``concurrency`` (closed loop)."""
    if find_perf_analyzer() is None:
        return _note(
            f"perf_analyzer did not run: {unavailable_reason() or 'not installed (run `make perf-analyzer`)'}"
        )
    console.print(f"  perf_analyzer vs our generator at concurrency {concurrency}")
    rows, figures, settings = [], {}, ""
    cpu: dict[str, list[list[float]]] = {}  # engine: [server, everything else] CPU ms per request, per round
    keep = session.engine
    with ExitStack() as stack:
        engines = _engines(session, stack)
        for round_index in range(rounds):
            for engine in engines:
                session.engine = engine
                try:
                    run = session.closed_loop(concurrency, seconds, f"{engine.name} c={concurrency}")
                except StudyError as error:
                    log.exception("%s failed", engine.name)
                    return _note(f"{engine.name} failed: {error}")
                finally:
                    session.engine = keep
                if isinstance(engine, PerfAnalyzerEngine) and engine.last_csv is not None:
                    theirs = engine.last_csv
                    # the same run's CPU is on the next row
                    rows.append(_row(CSV_ROW, round_index, theirs.throughput, theirs.p99_ms))
                    figures.setdefault("perf_analyzer", []).append([theirs.throughput, theirs.p99_ms])
                    settings = theirs.settings_text
                name = (
                    f"{engine.name}: our records from its export"
                    if isinstance(engine, PerfAnalyzerEngine)
                    else engine.name
                )
                server_ms, client_ms = run.cpu_ms_per_request()
                rows.append(_row(name, round_index, run.throughput, run.p99_ms, server_ms, client_ms))
                figures.setdefault(name, []).append([run.throughput, run.p99_ms])
                cpu.setdefault(name, []).append([server_ms, client_ms])
    config = session.current.label if session.current else "?"
    section = [
        "",
        f"{HEADING} (closed loop, concurrency {concurrency}, {config}, {session.protocol})",
        "",
        table(["engine", "round", "inf/s", "p99 ms", *CPU_COLUMNS], rows),
        "",
        _verdict(figures),
        "",
        cpu_verdict(figures, cpu),
        "",
        f"perf_analyzer settings: `{settings}` (three fixed windows; p99 of records skips the first 5%).",
    ]
    return {
        "sections": section,
        "figures": {"side_by_side": figures, "cpu_ms_per_request": cpu, "perf_analyzer_settings": settings},
    }


def _mean(rows: list[list[float]], column: int) -> float:
    values = [row[column] for row in rows]
    return sum(values) / len(values) if values else 0.0


def _verdict(figures: dict[str, list[list[float]]]) -> str:
    def mean(name: str) -> float:
        return _mean(figures.get(name, []), 0)

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


def cpu_verdict(figures: dict[str, list[list[float]]], cpu: dict[str, list[list[float]]]) -> str:
    """Why our generator sustains less than perf_analyzer, in CPU: each engine's client CPU per request
    over perf_analyzer's, and the throughput gap the whole CPU per request (server + client) would give
    if the shared cores were all that limited both, next to the gap measured (on two cores here the two
    agreed: the README's "Why ours sends less, in CPU")."""
    exported = next((name for name in cpu if name.endswith("our records from its export")), None)
    if exported is None:
        return "No CPU figures for perf_analyzer's run."
    pa_server, pa_client = (_mean(cpu[exported], k) for k in (0, 1))
    pa_rate = _mean(figures[exported], 0)
    lines = []
    for name, rows in cpu.items():
        if name == exported or not pa_rate or not pa_client:
            continue
        server, client = _mean(rows, 0), _mean(rows, 1)
        from_cpu = (pa_server + pa_client) / (server + client) - 1
        measured = _mean(figures[name], 0) / pa_rate - 1
        lines.append(
            f"{name}: the client {client:.3f} ms CPU per request, {client / pa_client:.1f}× perf_analyzer's "
            f"{pa_client:.3f}, so {from_cpu * 100:+.0f}% throughput if the cores limit both "
            f"({measured * 100:+.0f}% measured)"
        )
    return (
        "CPU per request (server: tritonserver and its stubs in /proc; the rest: the whole machine's busy "
        "time less the server's, the load engine's client mostly), on the cores client and server share: "
        + "; ".join(lines)
        + "."
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m perf.tune.witness``: only the side-by-side, on one configuration (no tuning)."""
    import argparse

    from rich.console import Console

    from exporters.resolve import load_spec
    from perf.tune.batcher_sim import BatcherConfig

    options = argparse.ArgumentParser(prog="python -m perf.tune.witness", description=main.__doc__)
    options.add_argument("--model", default="recommender")
    options.add_argument("--spec", type=Path, default=Path("models.yaml"))
    options.add_argument("--max-batch", type=int, default=8)
    options.add_argument("--delay-us", type=int, default=2000)
    options.add_argument("--instances", type=int, default=2)
    options.add_argument("--concurrency", type=int, default=16)
    options.add_argument("--seconds", type=float, default=3.0)
    options.add_argument("--rounds", type=int, default=2)
    options.add_argument("--workdir", type=Path, default=Path(".run/witness"))
    args = options.parse_args(argv)
    console = Console()
    args.workdir.mkdir(parents=True, exist_ok=True)
    config = BatcherConfig(args.max_batch, args.delay_us, instances=args.instances)
    with (
        LoadEngine(2) as engine,
        TuneSession(load_spec(args.spec), args.model, args.max_batch, args.workdir, engine) as session,
    ):
        session.prepare(config)
        extra = side_by_side(session, args.workdir, console, args.concurrency, args.seconds, args.rounds)
    console.print("\n".join(extra["sections"]), highlight=False, soft_wrap=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
