"""``python -m perf tune`` (``make tune MODEL=… P99_MS=… [RATE=…]``): options and the run.

Probe the model on a real server (at most the spec's ``max_batch_size``), predict every candidate with
the batcher simulation, search a shortlist on the server with the one measured search
(``perf.session.search``), answer with the best point a run held the budget at (verified around it, and
for a model with a variable axis measured once more by the shapes step, whose miss reopens it), write
the answer as a spec overlay, build it, and write ``result.json`` and the report rendered from it into
``reports/<timestamp>-tune/``. Where no run holds the budget: one line naming the closest run over it,
``partial.md`` with every run (not an answer), no ``spec.tuned.yaml``, exit status 3. A server that
died during a run: exit status 1, saying how it died, its log kept in the report folder.
``--scenario``, ``--follow`` and ``--witness`` are options of this parser; the tools they run live in
``perf.bench`` (``perf.bench.cli`` dispatches them), and reach the tuner's run only through ``Beside``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from exporters.repository import build_repository
from exporters.resolve import load_spec
from exporters.schema.models import Spec
from perf.errors import NothingMeetsError, OptionError, PerfError
from perf.markdown import number
from perf.measure.analyzer import PerfAnalyzerEngine, find_perf_analyzer, unavailable_message
from perf.measure.engine import LoadEngine, MeasureSettings, OurEngine
from perf.measure.loads import Load, read_trace, trace
from perf.measure.measurement import Measurement
from perf.measure.raw import measure_raw
from perf.measure.shapes import has_variable_axis
from perf.model.batcher import BatcherConfig
from perf.model.grid import QUICK_GRID, WIDE_GRID, Grid
from perf.report_folder import report_folder
from perf.session.model import TUNE_WINDOWS, ModelSession, keep_dead_server_log
from perf.session.shapes_section import ShapesOutcome, shapes_outcome
from perf.spec_overlay import write_overlay
from perf.tune.partial import write_partial
from perf.tune.report import render
from perf.tune.result import TuneDocument, document, save
from perf.tune.tuner import TuneRequest, TuneResult, tune
from server.ports import add_port_base_option

log = logging.getLogger(__name__)
WORKDIR = Path(".run/tune")
ENGINES = ("auto", "ours", "perf_analyzer")
WITNESSES = ("perf_analyzer", "model-analyzer")


@dataclasses.dataclass(frozen=True)
class TuneSetup:
    """What a ``make tune`` run is built from beyond its options: the grids ``--grid`` names, the
    server's work folder and the tuner itself. A test hands in a smaller grid, its own folder or a
    tuner that keeps its result, instead of patching this module's names."""

    quick_grid: Grid = QUICK_GRID
    wide_grid: Grid = WIDE_GRID
    workdir: Path = WORKDIR
    tuner: Callable[..., TuneResult] = tune


THE_SETUP = TuneSetup()  # what make tune runs with


@dataclasses.dataclass(frozen=True)
class TunedRun:
    """What a tool beside the tuner gets once the tuner's server stopped: the pick, the saved result
    (to which it returns its additions, as a new document, before the report is rendered), and a
    fresh session on another workdir."""

    spec: Spec
    model: str
    saved: TuneDocument
    chosen: BatcherConfig
    largest_batch: int
    instances: tuple[int, ...]
    new_session: Callable[[], ModelSession]
    folder: Path
    progress: Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class Beside:
    """Tools run in the same ``make tune``, handed in by the caller so that the tuner knows none of
    them: ``on_server`` returns a report section, measured on the tuned server with the pick loaded;
    ``after`` runs once that server stopped and returns the saved result with what it adds."""

    on_server: Callable[[ModelSession, Callable[[str], None]], list[str]] | None = None
    after: Callable[[TunedRun], TuneDocument] | None = None


def add_parser(commands: argparse._SubParsersAction) -> None:
    tune_parser = commands.add_parser("tune", help="pick the batching configuration for a p99 budget")
    tune_parser.add_argument("--model", help="a model of the spec (e.g. recommender)")
    tune_parser.add_argument("--spec", type=Path, default=Path("models.yaml"))
    tune_parser.add_argument("--p99-ms", type=float, help="the latency budget (p99, milliseconds)")
    tune_parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="target rate (requests/s); default: the highest within the budget",
    )
    tune_parser.add_argument("--trace", default=None, help="inter-arrival times (s) scaled to each rate")
    tune_parser.add_argument("--grid", choices=["quick", "wide"], default="quick")
    tune_parser.add_argument(
        "--seconds",
        type=float,
        default=3 * TUNE_WINDOWS.window_s,
        help="seconds the three measurement windows that count cover, per run",
    )
    tune_parser.add_argument(
        "--shortlist", type=int, default=4, help="families searched on the server (0: the prediction's first)"
    )
    tune_parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="auto",
        help="load engine: our client, perf_analyzer (`make perf-analyzer`), or auto: perf_analyzer where "
        "installed (ours with --follow)",
    )
    tune_parser.add_argument(
        "--keep-queue-policy",
        action="store_true",
        help="keep the spec's queue policy (on Triton 2.51 it stalls the batcher ~510 ms)",
    )
    tune_parser.add_argument("--seed", type=int, default=0)
    tune_parser.add_argument("--reports", type=Path, default=Path("reports"))
    add_port_base_option(tune_parser)
    tools = tune_parser.add_argument_group("tools beside the tuner")
    tools.add_argument(
        "--scenario", choices=["video", "recsys"], default=None, help="the article's scenarios (docs/TUNE.md)"
    )
    tools.add_argument(
        "--follow", action="store_true", help="follow a rate step with reloads (explicit model control)"
    )
    tools.add_argument(
        "--witness",
        nargs="?",
        const="perf_analyzer",
        choices=WITNESSES,
        default=None,
        help="after the tune: perf_analyzer and our client side by side (the default), or model-analyzer: "
        "Model Analyzer's brute search, both picks measured with one yardstick (docs/TUNE.md)",
    )
    tools.add_argument(
        "--witness-smoke",
        action="store_true",
        help="with --witness model-analyzer: Model Analyzer profiles the base configuration alone, one round",
    )


def usage_errors(args: argparse.Namespace) -> str | None:
    if args.engine == "perf_analyzer" and args.follow:
        return (
            "--follow reloads the model under load, and perf_analyzer 2.41.0 aborts at its next window after "
            "a reload; use --engine ours with --follow"
        )
    if args.engine == "perf_analyzer" and find_perf_analyzer() is None:
        return f"--engine perf_analyzer: {unavailable_message()}"
    if args.witness_smoke and args.witness != "model-analyzer":
        return "--witness-smoke is a setting of --witness model-analyzer"
    if args.witness == "model-analyzer" and engine_name(args) != "perf_analyzer":
        return "--witness model-analyzer measures both picks with perf_analyzer, as Model Analyzer does: " + (
            "use --engine perf_analyzer" if find_perf_analyzer() else unavailable_message()
        )
    if args.seconds <= 0:
        return f"--seconds must be > 0, got {args.seconds}"
    if args.scenario or args.follow:
        return None
    if not args.model or args.p99_ms is None:
        return "--model and --p99-ms are required (or --scenario video|recsys, or --follow)"
    if args.p99_ms <= 0:
        return f"--p99-ms must be > 0, got {args.p99_ms}"
    if args.rate is not None and args.rate <= 0:
        return f"--rate must be > 0, got {args.rate}"
    if args.shortlist < 0:
        return f"--shortlist must be >= 0, got {args.shortlist}"
    if args.trace and not Path(args.trace).is_file():
        return f"--trace: no such file {args.trace!r}"
    return None


def within_spec(grid: Grid, max_batch_size: int) -> Grid:
    """``grid`` with no max batch size above the spec's ``max_batch_size`` (the batch the model was
    exported, sized and checked for): a larger one becomes it."""
    if max_batch_size < 2:
        raise OptionError(f"the spec's max_batch_size is {max_batch_size}: there is no batching to tune")
    sizes = tuple(dict.fromkeys(min(size, max_batch_size) for size in grid.max_batches))
    return dataclasses.replace(grid, max_batches=sizes)


def engine_name(args: argparse.Namespace) -> str:
    """``--engine``: perf_analyzer where asked, or with ``auto`` where it is installed and the run does
    not reload under load (``--follow``: it aborts after a reload); our client otherwise."""
    wanted = getattr(args, "engine", "ours")
    if wanted != "auto":
        return wanted
    return "ours" if getattr(args, "follow", False) or find_perf_analyzer() is None else "perf_analyzer"


def engine_from_args(args: argparse.Namespace, folder: Path | None = None) -> LoadEngine:
    """The engine ``engine_name`` names; perf_analyzer logs its runs into ``folder``."""
    return PerfAnalyzerEngine(log_folder=folder) if engine_name(args) == "perf_analyzer" else OurEngine()


def windows_from_args(args: argparse.Namespace) -> MeasureSettings:
    """The tuner's windows, the three that count covering ``--seconds``."""
    return dataclasses.replace(TUNE_WINDOWS, window_s=args.seconds / TUNE_WINDOWS.stable_windows)


def _load_at(args: argparse.Namespace) -> Callable[[float], Load] | None:
    """With ``--trace``: the file's inter-arrival pattern, time-scaled to each rate asked for."""
    if not args.trace:
        return None
    recorded = read_trace(args.trace)
    with open(args.trace) as handle:
        intervals = [float(line.split("#")[0]) for line in handle if line.split("#")[0].strip()]
    return lambda rate: trace(
        [g * recorded.rate / rate for g in intervals], name=f"{args.trace} @ {rate:.0f}/s"
    )


def command_tune(
    args: argparse.Namespace, console, beside: Beside = Beside(), setup: TuneSetup = TuneSetup()
) -> int:
    """The tuner's run (``--scenario`` and ``--follow`` are ``perf.bench.cli``'s); ``beside``: the
    ``--witness`` tools."""
    spec = load_spec(args.spec)  # a spec error before any report folder is made
    within_spec(setup.quick_grid, spec.model(args.model).max_batch_size)  # ... and a batch limit of 1
    folder = report_folder(args.reports, "tune", "tune.log")
    try:
        with keep_dead_server_log(folder):
            saved, chosen = measure_and_pick(args, spec, folder, console, beside, setup)
    except NothingMeetsError as verdict:  # exit status 3 (perf.cli.main), no answer written
        verdict.hint = f"no answer written; every run measured (not an answer): {folder / 'partial.md'}"
        raise
    except PerfError as error:  # exit status 1 (perf.cli.main)
        error.hint = f"what was measured before it: {folder / 'partial.md'}"
        raise
    save(folder, saved)
    note = f"python -m perf tune --model {args.model} --p99-ms {args.p99_ms:g}: {chosen.label}"
    tuned = write_overlay(
        args.spec, spec.model(args.model), chosen, folder, note, args.keep_queue_policy, saved.buckets
    )
    console.print(f"  overlay validates; building {args.model} from spec.tuned.yaml")
    build_repository(tuned, folder / "repository", num_gpus=0, only=[args.model])
    report = render(folder)
    console.print((folder / "overlay.yaml").read_text(), highlight=False)
    print_summary(saved, report, console)
    return 0


@contextlib.contextmanager
def partial_on_failure(folder: Path, title: str, session: ModelSession) -> Iterator[None]:
    """On a ``PerfError`` (a measurement the engine could not make) or the verdict that nothing meets
    the budget, write ``partial.md`` with the runs measured so far, then let it through."""
    try:
        yield
    except NothingMeetsError as verdict:
        log.info("%s: %s. %s", title, verdict, verdict.detail)
        write_partial(folder, title, verdict, session.runs)
        raise
    except PerfError as error:
        log.exception("%s failed", title)
        write_partial(folder, title, error, session.runs)
        raise


def measure_and_pick(
    args: argparse.Namespace, spec: Spec, folder: Path, console, beside: Beside = Beside(),
    setup: TuneSetup = TuneSetup(),
) -> tuple[TuneDocument, BatcherConfig]:  # fmt: skip
    """The tuner (and the tools asked for) on one real server; the saved result and the pick. The raw
    backend is measured once the server has stopped, so that it gets the cores."""
    grid = setup.wide_grid if args.grid == "wide" else setup.quick_grid
    grid = within_spec(grid, spec.model(args.model).max_batch_size)
    request = TuneRequest(args.p99_ms, args.rate, grid, args.seed, _load_at(args), args.shortlist)
    engine = engine_from_args(args, folder)
    console.print(
        f"tuning [bold]{args.model}[/bold] for p99 ≤ {args.p99_ms:g} ms with {engine.name} → {folder}"
    )

    def progress(text: str) -> None:
        console.print(f"  {text}")

    windows = windows_from_args(args)

    def new_session(workdir: Path = setup.workdir) -> ModelSession:
        return ModelSession(
            spec, args.model, grid.largest_batch, workdir, engine, windows, keep_queue=args.keep_queue_policy
        )

    started = time.perf_counter()
    session = new_session()
    shapes: list[ShapesOutcome] = []  # the shapes step of each answer, the last one's the answer's

    def shapes_step(config: BatcherConfig, rate: float) -> Measurement | None:
        """The length buckets on the answer at its rate (the tuner chooses them); where no way met the
        budget, the run of the way the search sent is evidence about the answer's point."""
        shapes.append(shapes_outcome(session, config, request.load(rate), args.p99_ms, progress))
        return shapes[-1].as_searched if shapes[-1].buckets is None else None

    with session, partial_on_failure(folder, f"Tuning {args.model} for p99 ≤ {args.p99_ms:g} ms", session):
        recheck = shapes_step if has_variable_axis(session.base) else None
        result = setup.tuner(session, request, step=progress, **({"recheck": recheck} if recheck else {}))
        saved = document(result, args.model, engine.name, session.noise, session.cores)
        took = time.perf_counter() - started  # build and server start included
        saved = dataclasses.replace(saved, seconds=dataclasses.replace(saved.seconds, make_tune=took))
        if beside.on_server:
            session.prepare(result.chosen)
            saved = saved.with_section(beside.on_server(session, progress))
        if shapes:
            buckets = shapes[-1].buckets
            saved = dataclasses.replace(
                saved.with_section(shapes[-1].lines), buckets=None if buckets is None else tuple(buckets)
            )
    if beside.after:
        save(folder, saved)  # the tuner's result stands even where a long tool beside it fails
        saved = beside.after(
            TunedRun(
                spec, args.model, saved, result.chosen, session.largest_batch, grid.instances,
                lambda: new_session(setup.workdir / "yardstick"), folder, progress,
            )
        )  # fmt: skip
    model = session.base
    sizes = [b for b in (1, 4, 16, 32) if b <= session.largest_batch]
    raw = measure_raw(
        session.model_file, session.target.inputs, sizes, model.intra_op_threads, model.inter_op_threads, 0.3
    )
    return dataclasses.replace(saved, raw=tuple(raw)), result.chosen


def print_summary(saved: TuneDocument, report: Path, console) -> None:
    operating, noise = saved.operating, saved.noise
    measured = operating.measured
    held = " (holds the host's noise)" if measured and measured.host_noise else ""
    p99 = number(measured.p99_ms) if measured else "–"
    predicted = (
        f"predicted {number(saved.predicted_max_rate, 0)}/s (a prediction)"
        if saved.predicted_max_rate is not None
        else "no candidate was predicted within it"
    )
    console.print(
        f"chosen: [bold]{saved.chosen}[/bold]: measured within p99 {saved.budget_ms:g} ms up to "
        f"{number(saved.measured_max_rate, 0)}/s (the prediction's first: {saved.model_pick})"
    )
    console.print(
        f"  p99 at {number(saved.operating_rate, 0)}/s: measured {p99} ms{held}, predicted "
        f"{number(operating.predicted.p99_ms)} ms; highest rate within the budget: {predicted}; search "
        f"{saved.seconds.tuner:.0f} s; engine {saved.engine}; {len(noise.remeasured)} of {noise.runs} runs "
        f"measured again for steal; report {report}"
    )
