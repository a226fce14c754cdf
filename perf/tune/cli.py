"""``python -m perf tune`` (``make tune MODEL=… P99_MS=… [RATE=…]``): options and the run."""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from exporters.resolve import load_spec
from perf.analyzer import find_perf_analyzer
from perf.loads import Load, read_trace, trace
from perf.markdown import number
from perf.tune.candidates import QUICK_GRID, WIDE_GRID
from perf.tune.engine import ENGINES, engine_from_args
from perf.tune.measured import exhaustive, rematch
from perf.tune.overlay import write_overlay
from perf.tune.pa_engine import unavailable_message
from perf.tune.probe import served_capacity
from perf.tune.session import TuneSession, to_console
from perf.tune.steal import (
    STOLEN_HEADING,
    STOLEN_LIMIT,
    STOLEN_STREAK,
    STOLEN_STREAK_S,
    STOLEN_WAIT_S,
    counted_stolen,
    stolen_paragraph,
    stolen_summary,
)
from perf.tune.tuner import P99_GOAL, TuneRequest, tune

log = logging.getLogger(__name__)
WORKDIR = Path(".run/tune")


def add_parser(commands: argparse._SubParsersAction) -> None:
    tune_parser = commands.add_parser("tune", help="pick the batching configuration for a p99 budget")
    tune_parser.add_argument("--model", help="a model of the spec (e.g. recommender)")
    tune_parser.add_argument("--spec", type=Path, default=Path("models.yaml"))
    tune_parser.add_argument("--p99-ms", type=float, help="the latency budget (p99, milliseconds)")
    tune_parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="target Poisson rate (requests/s); default: the highest within the budget",
    )
    tune_parser.add_argument("--trace", default=None, help="inter-arrival times (s) scaled to each rate")
    tune_parser.add_argument(
        "--exhaustive", action="store_true", help="also measure every candidate (brute force)"
    )
    tune_parser.add_argument(
        "--scenario",
        choices=["video", "recsys"],
        default=None,
        help="the article's scenarios as presets (README, Tuning)",
    )
    tune_parser.add_argument(
        "--follow",
        action="store_true",
        help="demonstrate following a rate step with reloads (explicit model control)",
    )
    tune_parser.add_argument(
        "--keep-queue-policy",
        action="store_true",
        help="keep the spec's queue policy (on Triton 2.51 it stalls the batcher ~510 ms)",
    )
    tune_parser.add_argument("--grid", choices=["quick", "wide"], default="quick")
    tune_parser.add_argument(
        "--seconds", type=float, default=3.0, help="seconds of arrivals per measured point"
    )
    tune_parser.add_argument(
        "--processes", type=int, default=2, help="client processes of our load generator"
    )
    tune_parser.add_argument(
        "--stolen-wait-s",
        type=float,
        default=STOLEN_WAIT_S,
        help="at most this many seconds measuring a run again while the hypervisor took CPU from it "
        f"(steal ≥ {100 * STOLEN_LIMIT:.1f}%%; 0: never; none once the whole wait ran out for "
        f"{STOLEN_STREAK} measurements in a row and {STOLEN_STREAK_S:.0f} s or more, until a run is not "
        "stolen; README, Tuning)",
    )
    tune_parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="auto",
        help="load engine: our generator (--processes), perf_analyzer (`make perf-analyzer`), or auto: "
        "perf_analyzer where installed (ours with --follow)",
    )
    tune_parser.add_argument(
        "--shortlist",
        type=int,
        default=4,
        help="families (instances, max batch) whose best predicted candidate is measured before the pick; "
        "0: pick by prediction alone",
    )
    tune_parser.add_argument(
        "--baselines",
        type=int,
        default=2,
        help="of the first N shortlisted families, also measure the shortest delay where the model "
        "preferred a longer one (the model's costs favour delay); 0: the family bests only",
    )
    tune_parser.add_argument("--seed", type=int, default=0)
    tune_parser.add_argument("--reports", type=Path, default=Path("reports"))


def usage_errors(args: argparse.Namespace) -> str | None:
    if args.engine == "perf_analyzer" and args.follow:
        # measured: the window after a reload ends in "cb::Error: failed to find the requested model version"
        return (
            "--follow reloads the model under load, and perf_analyzer 2.41.0 aborts at its next window after "
            "a reload; use --engine ours with --follow"
        )
    if args.engine == "perf_analyzer" and find_perf_analyzer() is None:
        return f"--engine perf_analyzer: {unavailable_message()}"
    if args.stolen_wait_s < 0:
        return f"--stolen-wait-s must be >= 0, got {args.stolen_wait_s}"
    if args.scenario or args.follow:
        return None
    if not args.model or args.p99_ms is None:
        return "--model and --p99-ms are required (or --scenario video|recsys, or --follow)"
    if args.p99_ms <= 0:
        return f"--p99-ms must be > 0, got {args.p99_ms}"
    if args.rate is not None and args.rate <= 0:
        return f"--rate must be > 0, got {args.rate}"
    if args.seconds <= 0:
        return f"--seconds must be > 0, got {args.seconds}"
    if args.shortlist < 0:
        return f"--shortlist must be >= 0, got {args.shortlist}"
    if args.baselines < 0:
        return f"--baselines must be >= 0, got {args.baselines}"
    if args.processes < 1:
        return f"--processes must be >= 1, got {args.processes}"
    if args.trace and not Path(args.trace).is_file():
        return f"--trace: no such file {args.trace!r}"
    return None


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


def command_tune(args: argparse.Namespace, console) -> int:
    folder = args.reports / (datetime.now().strftime("%Y%m%d-%H%M%S") + "-tune")
    folder.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        level=logging.INFO,
        filename=folder / "tune.log",
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    if args.scenario:
        from perf.tune.scenarios import run_scenario

        return run_scenario(args, folder, console)
    if args.follow:
        from perf.tune.follow_demo import run_follow_demo

        return run_follow_demo(args, folder, console)
    spec = load_spec(args.spec)
    grid = WIDE_GRID if args.grid == "wide" else QUICK_GRID
    request = TuneRequest(
        args.p99_ms, args.rate, grid, args.seconds, args.seed, _load_at(args), args.shortlist, args.baselines
    )
    console.print(f"tuning [bold]{args.model}[/bold] for p99 ≤ {args.p99_ms:g} ms → {folder}")
    engine = engine_from_args(args)

    def progress(text: str) -> None:
        console.print(f"  {text}")

    with (
        engine,
        TuneSession(
            spec,
            args.model,
            grid.largest_batch,
            WORKDIR,
            engine,
            keep_queue=args.keep_queue_policy,
            stolen_wait_s=args.stolen_wait_s,
        ) as session,
    ):
        session.notify = to_console(console)
        result = tune(session, request, step=progress)
        sweep, head_to_head, sweep_stolen_s = None, None, 0.0
        if args.exhaustive:
            ceiling = 1.3 * served_capacity(result.probe)
            stolen_from = session.stolen_s
            sweep = exhaustive(session, request, ceiling, step=progress)
            sweep_stolen_s = session.stolen_s - stolen_from
            head_to_head = rematch(session, request, [sweep[0].config, result.chosen], ceiling, step=progress)
        session.prepare(result.chosen)
        extra = _side_by_side(session, folder, console)
        extra["figures"]["stolen"] = session.stolen_figures()
        extra["sections"] += ["", STOLEN_HEADING, "", stolen_paragraph(extra["figures"]["stolen"])]
    note = f"python -m perf tune --model {args.model} --p99-ms {args.p99_ms:g}: {result.chosen.label}"
    tuned = write_overlay(
        args.spec, spec.model(args.model), result.chosen, folder, note, args.keep_queue_policy
    )
    console.print(f"  overlay validates; building {args.model} from spec.tuned.yaml")
    from exporters.repository import build_repository

    build_repository(tuned, folder / "repository", num_gpus=0, only=[args.model])
    from perf.tune.report import write_report

    report = write_report(
        result,
        folder,
        args.model,
        engine.name,
        sweep,
        extra["sections"],
        extra["figures"],
        head_to_head,
        sweep_stolen_s,
    )
    console.print((folder / "overlay.yaml").read_text(), highlight=False)
    figures = (folder / "figures.json").read_text()
    log.info("figures: %s", figures)
    numbers = json.loads(figures)
    console.print(f"chosen: [bold]{result.chosen.label}[/bold] (prediction's first: {numbers['model_pick']})")
    n = numbers
    console.print(
        f"  p99 at {number(n['operating_rate'], 0)}/s: predicted {number(n['predicted_p99_ms'])} ms, "
        f"measured {number(n['measured_p99_ms'])} ms (median of {len(n['measured_p99_each_repeat_ms'])} "
        f"runs); highest rate within the budget: predicted "
        f"{number(n['predicted_max_rate'], 0)}/s, measured {number(n['measured_max_rate'], 0)}/s; "
        f"tuner {n['tuner_s']:.0f} s; engine {engine.name}; report {report}"
    )
    if confirmation := n["confirmation"]:
        runs = ", ".join(
            f"{number(r['p99_ms'])} ms at {number(r['rate'], 0)}/s" for r in confirmation["runs"]
        )
        state = "confirmed" if confirmation["confirmed"] else "not confirmed (every rate tried missed)"
        console.print(f"  operating rate {number(confirmation['rate'], 0)}/s {state}: {runs}")
    if taken := counted_stolen(result.operating_point.repeats):
        console.print(f"  at the operating point {taken}")
    if steal := stolen_summary(n["stolen"]):
        console.print(f"  {steal}")
    if spread := n["repeat_spread"]:
        console.print(
            f"  one run of a point and its run a pass later differ by ×{spread['median_ratio']:.2f} "
            f"(median of {spread['points']} points; more than ×{1 + P99_GOAL:.1f} in "
            f"{100 * spread['beyond_goal']:.0f}%)"
        )
    return 0


def _side_by_side(session: TuneSession, folder: Path, console) -> dict:
    from perf.tune.witness import side_by_side

    return side_by_side(session, folder, console)
