"""perf_analyzer and our load generator side by side, runs interleaved; each run's CPU per request says
why they differ (docs/TUNE.md, "perf_analyzer beside our client")."""

from __future__ import annotations

import argparse
import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean

import numpy as np

from perf.errors import OptionError, StudyError, check_at_least
from perf.markdown import number, table
from perf.measure.analyzer import PerfAnalyzerEngine, find_perf_analyzer, unavailable_message
from perf.measure.engine import LoadEngine, OurEngine
from perf.measure.loads import closed_loop
from perf.measure.measurement import Measurement, measure
from perf.session.model import ModelSession
from server.ports import add_port_base_option

log = logging.getLogger(__name__)
HEADING = "## perf_analyzer vs our client (`python -m perf witness`)"
CSV_ROW = "perf_analyzer (its own CSV)"
EXPORT_ROW = "perf_analyzer (our records from its export)"
HEADER = ["engine", "round", "inf/s", "p99 ms", "server CPU ms/request", "the rest's CPU ms/request",
          "stolen"]  # fmt: skip


@dataclass(frozen=True)
class WitnessOptions:
    """``python -m perf witness``'s options, and their defaults."""

    model: str = "recommender"
    spec: Path = Path("models.yaml")
    max_batch: int = 8
    delay_us: int = 2000
    instances: int = 2
    concurrency: int = 16
    workdir: Path = Path(".run/witness")

    def __post_init__(self) -> None:
        check_at_least((
            ("--max-batch", self.max_batch, 1), ("--delay-us", self.delay_us, 0),
            ("--instances", self.instances, 1), ("--concurrency", self.concurrency, 1),
        ))  # fmt: skip
        if not self.model:
            raise OptionError("--model must name a model of the spec, got ''")


def side_by_side(
    session: ModelSession, engines: list[LoadEngine], concurrency: int = 16, rounds: int = 2
) -> dict[str, list[Measurement]]:
    """Each engine's runs at ``concurrency`` (closed loop), engines interleaved round by round."""
    runs: dict[str, list[Measurement]] = {engine.name: [] for engine in engines}
    load = closed_loop(concurrency)
    for round_index in range(rounds):
        for engine in engines:
            label = f"{engine.name} c={concurrency} round {round_index + 1}"
            run = measure(session.target, load, session.settings, session.server, label, engine=engine)
            runs[engine.name].append(run)
    return runs


def rows(runs: dict[str, list[Measurement]]) -> list[list[str]]:
    """One row per run, perf_analyzer's twice: its CSV, and our records of its export (they must agree)."""
    out = []
    for name, measured in runs.items():
        for index, run in enumerate(measured):
            server_ms, rest_ms = run.server.cpu_ms_per_request() if run.server else (float("nan"),) * 2
            stolen = f"{100 * run.stolen_share:.1f}%" if run.server else "–"
            if run.own is not None:
                own = [number(run.own.throughput, 0), number(run.own.p99_ms, 2)]
                out.append([CSV_ROW, index + 1, *own, "–", "–", stolen])
            engine = EXPORT_ROW if name.startswith("perf_analyzer") else name
            cpu = [number(server_ms, 3), number(rest_ms, 3)]
            out.append([engine, index + 1, number(run.throughput, 0), number(run.p99_ms, 2), *cpu, stolen])
    return out


def cpu_verdict(runs: dict[str, list[Measurement]]) -> str:
    """The client CPU per request of both, and the throughput gap it gives if the cores limit both."""
    analyzer = next((m for name, m in runs.items() if name.startswith("perf_analyzer")), None)
    ours = runs.get(OurEngine.name)
    if not analyzer or not ours or not all(run.server for run in [*analyzer, *ours]):
        return "No CPU figures for both engines."
    (pa_server, pa_client), (server, client) = (
        np.mean([run.server.cpu_ms_per_request() for run in each], axis=0) for each in (analyzer, ours)
    )
    from_cpu = (pa_server + pa_client) / (server + client) - 1
    measured = fmean([r.throughput for r in ours]) / fmean([r.throughput for r in analyzer]) - 1
    return (
        f"Our client spends {client:.3f} ms of CPU per request, {client / pa_client:.1f}× perf_analyzer's "
        f"{pa_client:.3f}: if the shared cores limited both, that gives {from_cpu * 100:+.0f}% throughput "
        f"({measured * 100:+.0f}% measured)."
    )


def witness_section(session: ModelSession, concurrency: int = 16) -> list[str]:
    """The side by side on the configuration loaded now, as a report section."""
    if find_perf_analyzer() is None:
        return [HEADING, "", f"perf_analyzer did not run: {unavailable_message()}."]
    try:
        runs = side_by_side(session, [PerfAnalyzerEngine(), OurEngine()], concurrency)
    except StudyError as error:
        log.exception("the witness failed")
        return [HEADING, "", f"The witness failed: {error}"]
    config = session.current.label if session.current else "?"
    settings = next((" ".join(r.own.settings) for m in runs.values() for r in m if r.own), "")
    return [
        f"{HEADING}: closed loop, concurrency {concurrency}, {config}",
        "",
        table(HEADER, rows(runs)),
        "",
        cpu_verdict(runs),
        "",
        f"perf_analyzer ran with `{settings}`; ours with the same windows and stability rule.",
    ]


def command_witness(args: argparse.Namespace) -> int:
    """``python -m perf witness``: the side by side alone, on one configuration (no tuning)."""
    from exporters.resolve import load_spec
    from perf.model.batcher import BatcherConfig

    options = options_from(args)
    options.workdir.mkdir(parents=True, exist_ok=True)
    spec = load_spec(options.spec)
    with ModelSession(spec, options.model, options.max_batch, options.workdir, OurEngine()) as session:
        session.prepare(BatcherConfig(options.max_batch, options.delay_us, instances=options.instances))
        print("\n".join(witness_section(session, concurrency=options.concurrency)))
    return 0


def add_parser(commands: argparse._SubParsersAction) -> None:
    """``python -m perf witness``'s options; their defaults are ``WitnessOptions``'."""
    defaults = WitnessOptions()
    witness = commands.add_parser(
        "witness", help="perf_analyzer and our client side by side on one configuration",
        description=command_witness.__doc__,
    )  # fmt: skip
    for field in dataclasses.fields(WitnessOptions):
        default = getattr(defaults, field.name)
        witness.add_argument(f"--{field.name.replace('_', '-')}", type=type(default), default=default)
    add_port_base_option(witness)  # its server's ports, as for run, tune and plan (perf.cli.main sets it)


def options_from(args: argparse.Namespace) -> WitnessOptions:
    """A value it cannot run with is an ``OptionError`` (exit status 2) before any server starts."""
    return WitnessOptions(
        **{field.name: getattr(args, field.name) for field in dataclasses.fields(WitnessOptions)}
    )
