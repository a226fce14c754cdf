"""``python -m perf tune … --exhaustive``: every candidate measured, no prediction, as the yardstick for
the tuner's pick (what a brute-force tool such as Model Analyzer does).

Each candidate's sustainable rate is bisected on the server in ``(0, ceiling]`` (``ceiling``: 1.3 × the
most the probe saw served), one run per rate through the session's noise policy, like the tuner's own
runs. The section states the pick's rate against the best measured and the tuner's time against the
sweep's, judged by ``perf.goals.GOALS``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from perf.goals import GOALS, Goal, goals_table
from perf.markdown import number, table
from perf.model.batcher import BatcherConfig
from perf.model.predict import Prediction
from perf.tune.probe import Server
from perf.tune.tuner import Candidate, Point, TuneRequest, TuneResult

CEILING = 1.3  # × the most the probe saw served: the top of every bisection


def sweep_rate(
    server: Server, request: TuneRequest, config: BatcherConfig, ceiling: float, steps: int = 5
) -> Candidate:
    """The highest rate in ``(0, ceiling]`` that met the budget, by bisection: ``steps`` + 1 runs."""
    started = time.perf_counter()
    server.prepare(config)
    low, high, points = 0.0, ceiling, []
    for _ in range(steps + 1):
        rate = (low + high) / 2
        run = server.measure(request.load(rate), f"sweep {config.label} @ {rate:.0f}/s")
        points.append(Point(config, rate, Prediction(config, rate, float("nan"), 0.0, 0.0, False), run))
        low, high = (rate, high) if run.meets(request.budget_ms) else (low, rate)
    return Candidate(config, 0.0, points, time.perf_counter() - started, request.budget_ms)


def sweep(server: Server, result: TuneResult, step: Callable[[str], None]) -> list[Candidate]:
    """Every candidate of the tuner's grid, measured; best first."""
    request = result.request
    ceiling = CEILING * result.probe.capacity
    out = []
    for config in request.grid.candidates(request.budget_ms):
        step(f"sweep: {config.label}")
        out.append(sweep_rate(server, request, config, ceiling))
    return sorted(out, key=lambda c: -c.rate)


def sweep_section(result: TuneResult, swept: list[Candidate]) -> list[str]:
    """The sweep (``sweep``, best first) as the report's section."""
    best = swept[0]
    mine = next(c for c in swept if c.config == result.chosen)
    seconds = sum(c.seconds for c in swept)
    pick, took = GOALS["tuner pick"], GOALS["tuner time"]
    share = mine.rate / best.rate if best.rate else float("nan")
    goals = [
        Goal(
            pick.name,
            pick.target(),
            f"{result.chosen.label} {number(mine.rate, 0)}/s vs {best.config.label} "
            f"{number(best.rate, 0)}/s: {share:.2f}×",
            pick.met(share),
        ),
        Goal(
            took.name,
            took.target(),
            f"{result.tuner_s:.0f} s vs {seconds:.0f} s: {result.tuner_s / seconds:.2f}×",
            took.met(result.tuner_s / seconds),
        ),
    ]
    predicted = {r.config: r.rate for r in result.ranking}
    rows = [
        [
            c.config.label,
            number(c.rate, 0),
            number(predicted.get(c.config, float("nan")), 0),
            len(c.points),
            number(c.seconds, 0),
        ]
        for c in swept
    ]
    return [
        "## Every candidate measured (`--exhaustive`)",
        "",
        "Each candidate's highest rate within the budget, bisected in "
        f"(0, {number(CEILING * result.probe.capacity, 0)}]/s, one run per rate, no prediction.",
        "",
        goals_table(goals),
        "",
        table(["candidate", "measured max rate /s", "tuner predicted /s", "runs", "seconds"], rows),
    ]
