"""The operating point, confirmed on the server before the tuner stands behind it.

The shortlist's search accepts a rate after one run there met the budget, and one run here reproduces
within 20% in under half of the cases (``perf.tune.tuner.RepeatSpread``). In exhaustive runs 28, 30 and
31 the verification's six runs at 85% of the pick's sustained rate had a median p99 above the budget
(12.6, 13.1 and 10.8 ms for 10): the pass the rate rested on was a lucky draw (run 28: one run of 8.5 ms
at 4,958/s, where the verification measured 10.1 and 13.1 ms). So the tuner measures the pick at the
operating rate (two runs, a third where they disagree) and steps the rate down while most of them miss;
the runs are also the only ones measured at the rate the prediction is then judged at, so the
recalibration counts them (``perf.tune.tuner.recalibrate``). Their time is the tuner's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from perf.loads import Load
from perf.tune.batcher_sim import BatcherConfig
from perf.tune.measured import SHORTLIST_POINT_S, Step
from perf.tune.predict import arrival_array
from perf.tune.rules import verdict
from perf.tune.session import Observed, TuneSession

log = logging.getLogger(__name__)
OPERATING_SHARE = 0.85  # of the sustained rate: the operating point's first try, and each step down
CONFIRM_STEPS = 2  # at most this many steps down before the tuner operates at the last rate tried


@dataclass(frozen=True)
class Confirmation:
    """The pick measured at its operating rate before the verification: every run in order, the rate
    each offered, and the rate the tuner settled on."""

    rate: float  # the operating rate: the first a majority of its runs met the budget at, else the last
    confirmed: bool  # False: no rate tried was confirmed (the tuner operates at the last, and says so)
    rates: tuple[float, ...]
    runs: tuple[Observed, ...]
    point_s: float  # seconds of arrivals per run
    seconds: float  # wall time, reloads included


def confirm(
    session: TuneSession,
    config: BatcherConfig,
    sustained: float,
    budget_ms: float,
    load_at: Callable[[float], Load],
    step: Step | None = None,
    point_s: float = SHORTLIST_POINT_S,
) -> Confirmation:
    """``config`` measured at ``OPERATING_SHARE`` of ``sustained``, then ``OPERATING_SHARE`` of that
    while a majority of the runs there misses the budget, at most ``CONFIRM_STEPS`` times down.
    ``load_at``: rate -> load (the request's arrivals)."""
    started = time.perf_counter()
    session.prepare(config)
    rates: list[float] = []
    runs: list[Observed] = []
    rate = OPERATING_SHARE * sustained
    for attempt in range(CONFIRM_STEPS + 1):
        if attempt:
            rate *= OPERATING_SHARE
        (step or (lambda text: None))(f"confirming {config.label} at {rate:.0f}/s")
        arrivals = arrival_array(load_at(rate), point_s)
        here: list[Observed] = []
        while verdict(here, budget_ms) is None:
            here.append(session.open_loop(arrivals, f"confirm {config.label} @ {rate:.0f}/s"))
        rates += [rate] * len(here)
        runs += here
        log.info(
            "confirm %s @ %.0f/s: p99 %s ms", config.label, rate, ", ".join(f"{r.p99_ms:.1f}" for r in here)
        )
        if verdict(here, budget_ms):
            return Confirmation(rate, True, tuple(rates), tuple(runs), point_s, time.perf_counter() - started)
    log.warning(
        "%s missed p99 <= %g ms at every rate tried down to %.0f/s: operating there unconfirmed",
        config.label,
        budget_ms,
        rate,
    )
    return Confirmation(rate, False, tuple(rates), tuple(runs), point_s, time.perf_counter() - started)
