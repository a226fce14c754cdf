"""``python -m perf.tune.steal_check``: is this machine's p99 the model's or the hypervisor's?

One configuration at one fixed rate, measured run after run with nothing measured again, each run's
p99 next to the share of the CPUs' time the hypervisor took during it (steal in ``/proc/stat``) and the
CPU per request of the server and of the rest of the machine (the load engine's client); last,
the runs at or over ``perf.tune.steal.STOLEN_LIMIT`` against the others: how many missed the budget,
their p99 range and median. What the figures in ``perf.tune.steal`` come from; worth a minute on any
virtual machine before trusting a p99 measured on it.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console

from exporters.resolve import load_spec
from perf.loads import poisson
from perf.markdown import table
from perf.tune.batcher_sim import BatcherConfig
from perf.tune.engine import ENGINES, engine_from_args
from perf.tune.predict import arrival_array
from perf.tune.session import Observed, TuneSession
from perf.tune.steal import STOLEN_LIMIT, stolen


def summary(runs: list[Observed], budget_ms: float) -> list[list[str]]:
    """Rows: stolen runs and the others, each with its count, misses, p99 range and median."""
    rows = []
    for name, group in (
        (f"stolen ≥ {100 * STOLEN_LIMIT:.1f}%", [r for r in runs if stolen(r)]),
        ("the others", [r for r in runs if not stolen(r)]),
    ):
        p99 = [r.p99_ms for r in group]
        missed = sum(not r.meets(budget_ms) for r in group)
        spread = f"{min(p99):.1f}-{max(p99):.1f}" if p99 else "–"
        median = f"{statistics.median(p99):.1f}" if p99 else "–"
        rows.append([name, str(len(group)), str(missed), spread, median])
    return rows


def main(argv: list[str] | None = None) -> int:
    options = argparse.ArgumentParser(prog="python -m perf.tune.steal_check", description=__doc__)
    options.add_argument("--model", default="recommender")
    options.add_argument("--spec", type=Path, default=Path("models.yaml"))
    options.add_argument("--rate", type=float, default=1800.0, help="Poisson arrivals per second")
    options.add_argument("--runs", type=int, default=60)
    options.add_argument("--seconds", type=float, default=2.5, help="seconds of arrivals per run")
    options.add_argument("--max-batch", type=int, default=32)
    options.add_argument("--delay-us", type=int, default=1000)
    options.add_argument("--instances", type=int, default=1)
    options.add_argument("--p99-ms", type=float, default=10.0, help="the budget misses are counted against")
    options.add_argument("--engine", choices=ENGINES, default="auto")
    options.add_argument("--processes", type=int, default=2, help="client processes of our generator")
    args = options.parse_args(argv)
    if args.runs < 1 or args.rate <= 0 or args.seconds <= 0:
        options.error("--runs, --rate and --seconds must be positive")
    console = Console()
    config = BatcherConfig(args.max_batch, args.delay_us, instances=args.instances)
    arrivals = arrival_array(poisson(args.rate), args.seconds)
    runs: list[Observed] = []
    with (
        tempfile.TemporaryDirectory(prefix="steal_check_") as workdir,
        engine_from_args(args) as engine,
        TuneSession(load_spec(args.spec), args.model, args.max_batch, Path(workdir), engine) as session,
    ):
        session.prepare(config)
        console.print(f"{args.model} {config.label} at {args.rate:.0f}/s, {engine.name}, {args.runs} runs")
        for index in range(args.runs):
            run = session.open_loop(arrivals, f"steal check {index}", wait_s=0)
            runs.append(run)
            server_ms, rest_ms = run.cpu_ms_per_request()
            console.print(
                f"{index:3d} {time.strftime('%H:%M:%S')} p99 {run.p99_ms:6.1f} ms, served "
                f"{run.throughput:6.0f}/s, {100 * run.stolen_share:5.2f}% stolen, CPU per request "
                f"{server_ms:.2f} ms server + {rest_ms:.2f} ms the rest (the client, mostly)"
            )
    header = ["runs", "count", f"missed {args.p99_ms:g} ms", "p99 ms", "median"]
    console.print(table(header, summary(runs, args.p99_ms)), highlight=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
