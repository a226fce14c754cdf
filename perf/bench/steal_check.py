"""``python -m perf steal-check``: is this machine's p99 the model's or the hypervisor's?

One configuration at one fixed rate, measured run after run, nothing measured again; each run's p99
beside the share of the CPUs' time the hypervisor took during it (``perf.measure.noise``); last, the runs
that hold the host's noise against the others: how many missed the budget, their p99 range and median.
Worth a minute on any virtual machine before trusting a p99 measured on it.
"""

from __future__ import annotations

import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from exporters.resolve import load_spec
from perf.errors import OptionError, check_at_least
from perf.markdown import table
from perf.measure.engine import LoadEngine
from perf.measure.loads import poisson
from perf.measure.measurement import Measurement
from perf.measure.noise import NoisePolicy
from perf.model.batcher import BatcherConfig
from perf.session.model import ModelSession


@dataclass(frozen=True)
class StealCheckOptions:
    """What ``python -m perf steal-check`` runs with: one configuration (``max_batch``, ``delay_us``,
    ``instances``), Poisson arrivals at ``rate`` for ``runs`` runs, misses counted against ``p99_ms``.
    ``perf.bench.cli`` builds it from the command line, whose defaults are these."""

    model: str = "recommender"
    spec: Path = Path("models.yaml")
    rate: float = 1800.0
    runs: int = 20
    max_batch: int = 32
    delay_us: int = 1000
    instances: int = 1
    p99_ms: float = 10.0

    def __post_init__(self) -> None:
        check_at_least((
            ("--runs", self.runs, 1), ("--max-batch", self.max_batch, 1), ("--delay-us", self.delay_us, 0),
            ("--instances", self.instances, 1),
        ))  # fmt: skip
        for option, value in (("--rate", self.rate), ("--p99-ms", self.p99_ms)):
            if value <= 0:
                raise OptionError(f"{option} must be > 0, got {value}")
        if not self.model:
            raise OptionError("--model must name a model of the spec, got ''")


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


def run_steal_check(options: StealCheckOptions, engine: LoadEngine) -> int:
    """The runs, one line each as it ends, then the summary table; printed."""
    config = BatcherConfig(options.max_batch, options.delay_us, instances=options.instances)
    noise = NoisePolicy(remeasure=False)
    runs: list[Measurement] = []
    with (
        tempfile.TemporaryDirectory(prefix="steal_check_") as workdir,
        ModelSession(
            load_spec(options.spec), options.model, options.max_batch, Path(workdir), engine, noise=noise
        ) as session,
    ):
        session.prepare(config)
        print(f"{options.model} {config.label} at {options.rate:.0f}/s, {engine.name}, {options.runs} runs")
        for index in range(options.runs):
            run = session.measure(poisson(options.rate, index), f"steal check {index}")
            runs.append(run)
            server_ms, rest_ms = run.server.cpu_ms_per_request() if run.server else (float("nan"),) * 2
            print(
                f"{index:3d} p99 {run.p99_ms:6.1f} ms, served {run.throughput:6.0f}/s, "
                f"{100 * run.stolen_share:5.2f}% stolen, CPU per request {server_ms:.2f} ms server + "
                f"{rest_ms:.2f} ms the rest (the client, mostly)"
            )
    header = ["runs", "count", f"missed {options.p99_ms:g} ms", "p99 ms", "median"]
    print(table(header, summary(runs, options.p99_ms, noise)))
    return 0
