"""``python -m perf tune`` (``make tune``): the tuner's run on a real server, its answer written as a spec
overlay, built and reported in ``reports/<timestamp>-tune/`` (docs/TUNE.md). Exit status 3 where no
run holds the budget (``partial.md``, no ``spec.tuned.yaml``), 1 where a server died (its log kept)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from exporters.repository import build_repository
from exporters.resolve import load_spec
from exporters.schema.models import Spec
from perf.errors import NothingMeetsError, OptionError, PerfError
from perf.markdown import number, report_folder, table
from perf.measure.analyzer import PerfAnalyzerEngine, find_perf_analyzer, unavailable_message
from perf.measure.engine import MeasureSettings, OurEngine
from perf.measure.loads import Load, read_trace
from perf.measure.measurement import Measurement
from perf.measure.raw import measure_raw
from perf.measure.shapes import has_variable_axis
from perf.model.batcher import BatcherConfig
from perf.model.grid import QUICK_GRID, WIDE_GRID, Grid
from perf.session.model import (
    TUNE_WINDOWS,
    ModelSession,
    add_window_options,
    bound_error,
    keep_dead_server_log,
    run_windows,
    window_usage_error,
)
from perf.session.search import Evidence
from perf.session.shapes_section import ShapesFigures, shapes_step
from perf.spec_overlay import write_overlay
from perf.tune.report import prediction_figure, render
from perf.tune.result import TuneDocument, document, save
from perf.tune.tuner import TuneRequest, TuneResult, tune
from server.ports import add_port_base_option

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TuneSetup:
    """What a ``make tune`` run is built from beyond its options (a test hands in its own)."""

    quick_grid: Grid = QUICK_GRID
    wide_grid: Grid = WIDE_GRID
    workdir: Path = Path(".run/tune")
    windows: MeasureSettings = TUNE_WINDOWS
    session: Callable[..., ModelSession] = ModelSession
    tuner: Callable[..., TuneResult] = tune
    perf_analyzer: Callable[[], Path | None] = find_perf_analyzer


THE_SETUP = TuneSetup()  # what make tune runs with


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("tune", help="pick the batching configuration for a p99 budget")
    add = parser.add_argument
    add("--model", help="a model of the spec (e.g. recommender)")
    add("--spec", type=Path, default=Path("models.yaml"))
    add("--p99-ms", type=float, help="the latency budget (p99, milliseconds)")
    add("--rate", type=float, help="target rate (requests/s); default: the highest within the budget")
    add("--trace", help="inter-arrival times (s) scaled to each rate")
    add("--grid", choices=["quick", "wide"], default="quick")
    add_window_options(parser)
    add(
        "--shortlist", type=int, default=4, help="families searched on the server (0: the prediction's first)"
    )
    add("--engine", choices=["auto", "ours", "perf_analyzer"], default="auto",
        help="load engine: our client, perf_analyzer (`make perf-analyzer`), or auto: perf_analyzer where "
        "installed")  # fmt: skip
    add("--keep-queue-policy", action="store_true",
        help="keep the spec's queue policy (on Triton 2.51 it stalls the batcher ~510 ms)")  # fmt: skip
    add("--seed", type=int, default=0)
    add("--reports", type=Path, default=Path("reports"))
    add_port_base_option(parser)


def usage_errors(args: argparse.Namespace, setup: TuneSetup = THE_SETUP) -> str | None:
    if args.engine == "perf_analyzer" and setup.perf_analyzer() is None:
        return f"--engine perf_analyzer: {unavailable_message()}"
    if (window_error := window_usage_error(args)) is not None:
        return window_error
    if not args.model or args.p99_ms is None:
        return "--model and --p99-ms are required"
    bound = bound_error(
        ("--p99-ms", args.p99_ms, ">", 0),
        ("--rate", args.rate, ">", 0),
        ("--shortlist", args.shortlist, ">=", 0),
    )
    if bound is None and args.trace and not Path(args.trace).is_file():
        return f"--trace: no such file {args.trace!r}"
    return bound


def engine_name(args: argparse.Namespace, setup: TuneSetup = THE_SETUP) -> str:
    """``--engine``: perf_analyzer where asked, or with ``auto`` where it is installed; else our client."""
    if args.engine != "auto":
        return args.engine
    return "ours" if setup.perf_analyzer() is None else "perf_analyzer"


def _load_at(args: argparse.Namespace) -> Callable[[float], Load] | None:
    """With ``--trace``: the file's inter-arrival pattern, time-scaled to each rate asked for."""
    if not args.trace:
        return None
    recorded = read_trace(args.trace)
    return lambda rate: dataclasses.replace(
        recorded, name=f"{args.trace} @ {rate:.0f}/s", rate=rate,
        arrivals=lambda: (t * recorded.rate / rate for t in recorded.arrivals()),
    )  # fmt: skip


def command_tune(args: argparse.Namespace, console, setup: TuneSetup = THE_SETUP) -> int:
    """``python -m perf tune``: the tuner's run, its answer written, built and reported."""
    spec = load_spec(args.spec)  # a spec error before any report folder is made
    exported = spec.model(args.model).max_batch_size  # no max batch size above the one exported for
    if exported < 2:
        raise OptionError(f"the spec's max_batch_size is {exported}: there is no batching to tune")
    grid = setup.wide_grid if args.grid == "wide" else setup.quick_grid
    sizes = tuple(dict.fromkeys(min(size, exported) for size in grid.max_batches))
    grid = dataclasses.replace(grid, max_batches=sizes)
    folder = report_folder(args.reports, "tune", "tune.log")
    try:
        with keep_dead_server_log(folder):
            saved, chosen = measure_and_pick(args, spec, grid, folder, console, setup)
    except NothingMeetsError as verdict:  # exit status 3 (perf.cli.main), no answer written
        verdict.hint = f"no answer written; every run measured (not an answer): {folder / 'partial.md'}"
        raise
    except PerfError as error:  # exit status 1 (perf.cli.main)
        error.hint = f"what was measured before it: {folder / 'partial.md'}"
        raise
    save(folder, saved)
    note = f"python -m perf tune --model {args.model} --p99-ms {args.p99_ms:g}: {chosen.label}"
    base, keep = spec.model(args.model), args.keep_queue_policy
    tuned = write_overlay(args.spec, base, chosen, folder, note, keep, saved.buckets)
    console.print(f"  overlay validates; building {args.model} from spec.tuned.yaml")
    build_repository(tuned, folder / "repository", num_gpus=0, only=[args.model])
    console.print((folder / "overlay.yaml").read_text(), highlight=False)
    print_summary(saved, render(folder), console)
    return 0


@contextlib.contextmanager
def partial_on_failure(folder: Path, title: str, session: ModelSession) -> Iterator[None]:
    """On a ``PerfError`` (the verdict that nothing meets included) write ``partial.md``, then re-raise."""
    try:
        yield
    except PerfError as error:
        if isinstance(error, NothingMeetsError):
            log.info("%s: %s. %s", title, error, error.detail)
        else:
            log.exception("%s failed", title)
        write_partial(folder, title, error, session.runs)
        raise


def write_partial(folder: Path, title: str, error: BaseException, runs: Sequence[Measurement]) -> None:
    """``partial.md``: ``error`` and the runs before it, so minutes of measuring survive a failure."""
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
            "",
            "Nothing below is an answer: no `spec.tuned.yaml` was written.",
        ]
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
    (folder / "partial.md").write_text("\n".join(lines) + "\n")


def measure_and_pick(
    args: argparse.Namespace, spec: Spec, grid: Grid, folder: Path, console, setup: TuneSetup = THE_SETUP
) -> tuple[TuneDocument, BatcherConfig]:
    """The tuner on one real server; the saved result and the pick (the raw backend once it has stopped)."""
    request = TuneRequest(args.p99_ms, args.rate, grid, args.seed, _load_at(args), args.shortlist)
    analyzer = engine_name(args, setup) == "perf_analyzer"
    engine = PerfAnalyzerEngine(log_folder=folder) if analyzer else OurEngine()  # it logs its runs there
    console.print(
        f"tuning [bold]{args.model}[/bold] for p99 ≤ {args.p99_ms:g} ms with {engine.name} → {folder}"
    )

    def progress(text: str) -> None:
        console.print(f"  {text}")

    started = time.perf_counter()
    windows = run_windows(setup.windows, args)
    keep = args.keep_queue_policy
    session = setup.session(
        spec, args.model, grid.largest_batch, setup.workdir, engine, windows, keep_queue=keep
    )
    shapes: list[ShapesFigures] = []  # the shapes step of each answer, the last one's the answer's

    def shapes_of(config: BatcherConfig, rate: float, evidence: Evidence[BatcherConfig]) -> None:
        """The length buckets on the answer at its rate (the tuner chooses them), its runs evidence."""
        found = shapes_step(session, config, request.load, rate, evidence, config, config.label, progress)
        shapes.append(found)

    with session, partial_on_failure(folder, f"Tuning {args.model} for p99 ≤ {args.p99_ms:g} ms", session):
        recheck = shapes_of if has_variable_axis(session.base) else None
        result = setup.tuner(session, request, step=progress, recheck=recheck)
        saved = document(result, args.model, engine.name, session.noise, session.cores)
        took = time.perf_counter() - started  # build and server start included
        saved = dataclasses.replace(saved, seconds=dataclasses.replace(saved.seconds, make_tune=took))
        if shapes:
            saved = dataclasses.replace(saved.with_section(shapes[-1].section), buckets=shapes[-1].buckets)
    threads, sizes = session.base.threads, [b for b in (1, 4, 16, 32) if b <= session.largest_batch]
    raw = measure_raw(
        session.model_file, session.target.inputs, sizes, threads.intra_op, threads.inter_op, 0.3
    )
    return dataclasses.replace(saved, raw=tuple(raw)), result.chosen


def print_summary(saved: TuneDocument, report: Path, console) -> None:
    """The answer in two lines: the measured rate first, the prediction only labelled as one."""
    noise = saved.noise
    measured = saved.operating.measured
    held = " (holds the host's noise)" if measured and measured.host_noise else ""
    p99 = number(measured.p99_ms) if measured else "–"
    console.print(
        f"chosen: [bold]{saved.chosen}[/bold]: measured within p99 {saved.budget_ms:g} ms up to "
        f"{number(saved.measured_max_rate, 0)}/s (the prediction's first: {saved.model_pick})"
    )
    console.print(
        f"  p99 at {number(saved.operating_rate, 0)}/s: measured {p99} ms{held}, predicted "
        f"{number(saved.operating.predicted.p99_ms)} ms; the prediction (not a measurement): "
        f"{prediction_figure(saved)}; search {saved.seconds.tuner:.0f} s; engine {saved.engine}; "
        f"{len(noise.remeasured)} of {noise.runs} runs measured again for steal; report {report}"
    )
