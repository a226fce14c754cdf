"""``python -m perf steal-check``: is this machine's p99 the model's or the hypervisor's?

One configuration at one fixed rate, measured run after run, nothing measured again; each run's p99
beside the share of the CPUs' time the hypervisor took during it (``perf.measure.noise``); last, the runs
that hold the host's noise against the others: how many missed the budget, their p99 range and median.
Worth a minute on any virtual machine before trusting a p99 measured on it.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from exporters.resolve import load_spec
from perf.markdown import table
from perf.measure.loads import poisson
from perf.measure.measurement import Measurement
from perf.measure.noise import NoisePolicy
from perf.model.batcher import BatcherConfig
from perf.session.model import ModelSession
from perf.tune.cli import ENGINES, engine_from_args


def summary(runs: list[Measurement], budget_ms: float, noise: NoisePolicy) -> list[list[str]]:
    """Rows: the runs that hold the host's noise and the others: count, misses, p99 range and median."""
    rows = []
    for name, group in (
        (f"stolen ≥ {100 * noise.stolen_limit:.1f}%", [r for r in runs if noise.holds_noise(r)]),
        ("the others", [r for r in runs if not noise.holds_noise(r)]),
    ):
        p99 = [r.p99_ms for r in group]
        missed = sum(not r.meets(budget_ms) for r in group)
        spread = f"{min(p99):.1f}-{max(p99):.1f}" if p99 else "–"
        median = f"{statistics.median(p99):.1f}" if p99 else "–"
        rows.append([name, str(len(group)), str(missed), spread, median])
    return rows


def main(argv: list[str] | None = None) -> int:
    options = argparse.ArgumentParser(prog="python -m perf steal-check", description=__doc__)
    options.add_argument("--model", default="recommender")
    options.add_argument("--spec", type=Path, default=Path("models.yaml"))
    options.add_argument("--rate", type=float, default=1800.0, help="Poisson arrivals per second")
    options.add_argument("--runs", type=int, default=20)
    options.add_argument("--max-batch", type=int, default=32)
    options.add_argument("--delay-us", type=int, default=1000)
    options.add_argument("--instances", type=int, default=1)
    options.add_argument("--p99-ms", type=float, default=10.0, help="the budget misses are counted against")
    options.add_argument("--engine", choices=ENGINES, default="auto")
    args = options.parse_args(argv)
    if args.runs < 1 or args.rate <= 0:
        options.error("--runs and --rate must be positive")
    config = BatcherConfig(args.max_batch, args.delay_us, instances=args.instances)
    noise = NoisePolicy(remeasure=False)
    runs: list[Measurement] = []
    engine = engine_from_args(args)
    with (
        tempfile.TemporaryDirectory(prefix="steal_check_") as workdir,
        ModelSession(
            load_spec(args.spec), args.model, args.max_batch, Path(workdir), engine, noise=noise
        ) as session,
    ):
        session.prepare(config)
        print(f"{args.model} {config.label} at {args.rate:.0f}/s, {engine.name}, {args.runs} runs")
        for index in range(args.runs):
            run = session.measure(poisson(args.rate, index), f"steal check {index}")
            runs.append(run)
            server_ms, rest_ms = run.server.cpu_ms_per_request() if run.server else (float("nan"),) * 2
            print(
                f"{index:3d} p99 {run.p99_ms:6.1f} ms, served {run.throughput:6.0f}/s, "
                f"{100 * run.stolen_share:5.2f}% stolen, CPU per request {server_ms:.2f} ms server + "
                f"{rest_ms:.2f} ms the rest (the client, mostly)"
            )
    header = ["runs", "count", f"missed {args.p99_ms:g} ms", "p99 ms", "median"]
    print(table(header, summary(runs, args.p99_ms, noise)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
