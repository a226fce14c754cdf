"""Sustainable rates found by measurement alone: the brute force, its head-to-head rematch, and the
tuner's shortlist.

All three use one search (``measured_max_rate``): a bisection on the offered rate, each point an open
loop on the same Poisson arrivals the prediction used, measured until a rule (``perf.tune.rules``)
decides it: for the brute force and the shortlist a pass counts and a miss is measured once more
(unless the server fell far behind or, in the shortlist, missed by more than twice the budget,
``SHORTLIST_REPEAT_WITHIN``); for the rematch a majority of up to three runs decides. The brute force
bisects the whole range ``(0, ceiling]`` for every candidate of the grid (what Model Analyzer does);
the shortlist starts at the simulation's prediction and bisects a bracket around it, so it costs a few
points per candidate instead of a sweep.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from perf.tune.batcher_sim import BatcherConfig
from perf.tune.predict import arrival_array
from perf.tune.rules import Judge, majority_kept_up, one_pass
from perf.tune.session import Observed, TuneSession

if TYPE_CHECKING:  # the tuner imports this module; these are for the type hints only
    from perf.tune.tuner import Ranked, TuneRequest

log = logging.getLogger(__name__)
# Seconds of arrivals per shortlist point, shorter than the brute force's 4: at these rates 2.5 s still
# hold 7,500-12,500 requests (a p99 from 75-125 tail samples). At 3 s, with six candidates and the wait
# after each reload, the tuner took 0.21 of the brute force's time (run 13).
SHORTLIST_POINT_S = 2.5
# The shortlist does not measure again a miss whose p99 is beyond this multiple of the budget: in the
# shortlists of exhaustive runs 23-31, 1 of 23 such misses met the budget in its repeat (over sweep,
# rematch and shortlist alike: 19 of 273), and a repeat that does is the lucky draw the tuner would then
# stand behind. About 10 s a tune (2-4 repeats), which the operating point's confirmation spends.
SHORTLIST_REPEAT_WITHIN = 2.0
SHORTLIST_RULE = functools.partial(one_pass, repeat_within=SHORTLIST_REPEAT_WITHIN)
Step = Callable[[str], None]


@dataclass
class SweepEntry:
    config: BatcherConfig
    rate: float  # measured sustainable rate (0: no rate tried met the budget)
    points: list[Observed]
    seconds: float
    missed_at: float = 0.0  # a shortlist challenger that missed the leader's rate: its rate is below this
    passed_run: Observed | None = None  # the run that met the budget at ``rate``
    point_s: float = 0.0  # seconds of arrivals per point (``passed_run`` replayed these)
    rates: list[float] = dataclasses.field(default_factory=list)  # the rate each of ``points`` offered


def measured_max_rate(
    session: TuneSession,
    request: TuneRequest,
    config: BatcherConfig,
    ceiling: float,
    steps: int = 5,
    first: float | None = None,
    floor: float = 0.0,
    purpose: str = "sweep",
    challenge: bool = False,
    seconds: float | None = None,
    judge: Judge = one_pass,
) -> SweepEntry:
    """The highest rate in ``(floor, ceiling]`` that met the budget, by measurement: a first point (at
    ``first``, or the middle), then ``steps`` halvings of the bracket. 0 when no point met it (a
    bracket's floor is never assumed to pass). With ``challenge``, a first point that misses ends the
    search (``missed_at``): the candidate cannot beat the rate it was challenged at. ``seconds`` of
    arrivals per point (the request's by default). Each point is measured until ``judge`` decides it
    (``perf.tune.rules``; by default a pass counts and a miss is measured once more)."""
    started = time.perf_counter()
    session.prepare(config)
    low, high, runs, rates, passed, passed_run = floor, ceiling, [], [], 0.0, None
    point_s = seconds or request.seconds
    for index in range(steps + 1):
        rate = first if index == 0 and first else (low + high) / 2
        arrivals = arrival_array(request.load(rate), point_s)
        here: list[Observed] = []
        while (met := judge(here, request.budget_ms)) is None:
            run = session.open_loop(arrivals, f"{purpose} {config.label} @ {rate:.0f}/s")
            here.append(run)
            log.info(
                "%s: p99 %.1f ms, served %.0f/s, %d failed, %.1f%% stolen",
                run.label,
                run.p99_ms,
                run.throughput,
                run.failed,
                100 * run.stolen_share,
            )
        runs += here
        rates += [rate] * len(here)
        if met:
            if rate > passed:
                passed, passed_run = rate, next(run for run in reversed(here) if run.meets(request.budget_ms))
            low = rate
        elif challenge and index == 0:
            return SweepEntry(
                config, 0.0, runs, time.perf_counter() - started, rate, point_s=point_s, rates=rates
            )
        else:
            high = rate
    return SweepEntry(config, passed, runs, time.perf_counter() - started, 0.0, passed_run, point_s, rates)


def exhaustive(
    session: TuneSession, request: TuneRequest, ceiling: float, step: Step | None = None
) -> list[SweepEntry]:
    """Every candidate of the grid, measured; best first."""
    step = step or (lambda text: None)
    entries = []
    for config in request.grid.candidates(request.budget_ms):
        step(f"brute force: {config.label}")
        entries.append(measured_max_rate(session, request, config, ceiling))
    return sorted(entries, key=lambda e: -e.rate)


def rematch(
    session: TuneSession,
    request: TuneRequest,
    configs: list[BatcherConfig],
    ceiling: float,
    rounds: int = 2,
    step: Step | None = None,
) -> dict[BatcherConfig, list[SweepEntry]]:
    """``configs`` (the sweep's best and the tuner's pick) measured again head to head: ``rounds``
    rounds, each measuring every config once, so a neighbour's burst of CPU that cut one candidate's
    figure in the sweep hits both alike here. The sweep ran its candidates minutes apart, one bisection
    each: on a shared machine one disturbed point halves a figure. The same bisection as the sweep's,
    but each rate judged by a majority of up to three runs (``perf.tune.rules.majority_kept_up``): the
    sweep's rule (a pass counts) keeps the luckier of two draws, and the best of ~20 candidates so
    measured is the luckiest of many; held to it, the sweep's best in run 34 rested on one run of six."""
    step = step or (lambda text: None)
    out: dict[BatcherConfig, list[SweepEntry]] = {config: [] for config in dict.fromkeys(configs)}
    for round_index in range(rounds):
        for config in out:
            step(f"rematch {round_index + 1}/{rounds}: {config.label}")
            out[config].append(measured_max_rate(session, request, config, ceiling, judge=majority_kept_up))
    return out


def shortlist(ranking: list[Ranked], size: int, window: float = 0.75, baselines: int = 2) -> list[Ranked]:
    """The candidates the tuner measures before it picks: the best predicted of each family (instance
    count and max batch size), best first, those predicted within ``window`` of the top, at most
    ``size``; then, for the first ``baselines`` of those families, the family's shortest delay within
    the window (its no-wait baseline) where the model preferred a longer one.

    The simulation follows the batcher's rules exactly, but its costs come from the probe, and two of
    them lean one way. What instances sharing the cores cost each other is measured at saturation
    (two-instance configs sustained up to 1.5× the predicted rate). And the busy cores it fits count an
    idle runtime's spinning threads as work per execution, which favours a longer delay (fewer,
    larger batches): in four perf_analyzer sweeps the best measured had a delay of 0-1 ms while the
    model's first had 0-2 ms, and one run's best (0 ms) was predicted within 3% of its family's best
    (2 ms) yet sustained 3× it. ``ranking``: the candidates predicted to meet the budget, best first."""
    if not ranking or size < 1:
        return []
    top = ranking[0].rate
    near = [entry for entry in ranking if entry.rate >= window * top]
    picked: dict[tuple[int, int], Ranked] = {}
    for entry in near:
        picked.setdefault(_family(entry), entry)
    bests = list(picked.values())[:size]
    shortest = []
    for best in bests[:baselines]:
        family = [entry for entry in near if _family(entry) == _family(best)]
        baseline = min(family, key=lambda entry: entry.config.max_queue_delay_us)
        if baseline.config.max_queue_delay_us < best.config.max_queue_delay_us:
            shortest.append(baseline)
    return bests + shortest


def _family(entry: Ranked) -> tuple[int, int]:
    return entry.config.instances, entry.config.max_batch_size


def measure_shortlist(
    session: TuneSession,
    request: TuneRequest,
    entries: list[Ranked],
    step: Step | None = None,
    bracket: tuple[float, float] = (0.6, 1.5),
    steps: int = 2,
    seconds: float = SHORTLIST_POINT_S,
) -> list[SweepEntry]:
    """The shortlist measured in the model's order. Until one meets the budget, each is measured in
    ``bracket`` × its predicted rate: a first point at the prediction, then ``steps`` halvings (two:
    ±6% in three points). After that each is a challenger: its first point is at the leader's rate, and
    missing there ends it, since only a higher rate can change the pick; meeting it, the search
    goes on above. Best measured first (ties: the earlier, i.e. the model's order). Each point is
    ``seconds`` of arrivals (``SHORTLIST_POINT_S``).

    A candidate that missed its whole bracket says the predictions are optimistic by at least its
    prediction over its lowest miss (the machine slowed down after the probe, or the model is off for
    this load): the candidates measured after it, until one meets the budget, are bracketed around
    their predictions scaled down by that much. Without it each of them missed its own whole bracket
    too (run 15: the first three, six runs each, before the fourth met the budget; the shortlist took
    127 s). After one such miss the bracket's top (1.5× the scaled center) still reaches their
    unscaled predictions."""
    step = step or (lambda text: None)
    out: list[SweepEntry] = []
    leader, scale = 0.0, 1.0
    for entry in entries:
        predicted = entry.rate or request.rate or 0.0  # with a target rate, a candidate may have no best
        if predicted <= 0:
            continue
        center = scale * predicted
        low, high = (factor * center for factor in bracket)
        if leader:
            step(f"shortlist: {entry.config.label} challenges {leader:.0f}/s")
            high = max(high, bracket[1] * leader)
            found = measured_max_rate(
                session,
                request,
                entry.config,
                high,
                steps,
                leader,
                leader,
                "shortlist",
                challenge=True,
                seconds=seconds,
                judge=SHORTLIST_RULE,
            )
        else:
            step(f"shortlist: measuring {entry.config.label} around {center:.0f}/s")
            found = measured_max_rate(
                session,
                request,
                entry.config,
                high,
                steps,
                center,
                low,
                "shortlist",
                seconds=seconds,
                judge=SHORTLIST_RULE,
            )
            if found.rate <= 0:
                scale = min(scale, lowest_miss(found) / predicted)
        out.append(found)
        leader = max(leader, found.rate)
    return sorted(out, key=lambda e: -e.rate)


def lowest_miss(entry: SweepEntry) -> float:
    """The lowest rate ``entry``'s runs offered (for an entry that met nothing: the lowest it missed)."""
    return min(run.offered for run in entry.points)


def below_the_brackets(
    session: TuneSession,
    request: TuneRequest,
    measured: list[SweepEntry],
    step: Step | None = None,
    steps: int = 2,
    seconds: float = SHORTLIST_POINT_S,
) -> list[SweepEntry]:
    """``measured`` (the shortlist, in the model's order when nothing met the budget), with its first
    candidate searched again in (0, the lowest rate it missed] when no candidate met the budget
    anywhere in its bracket. The tuner then picks that candidate (the prediction's first), and the
    verification needs a rate it was measured to sustain: 85% of a prediction the shortlist had just
    refuted ran it overloaded (run 11: every bracket missed at 0.6x its prediction, the machine having
    slowed down after the probe). Unchanged when something met the budget."""
    if not measured or any(entry.rate > 0 for entry in measured):
        return measured
    first = measured[0]
    ceiling = lowest_miss(first)
    (step or (lambda text: None))(
        f"shortlist: nothing met the budget; {first.config.label} below {ceiling:.0f}/s"
    )
    again = measured_max_rate(
        session,
        request,
        first.config,
        ceiling,
        steps,
        purpose="shortlist",
        seconds=seconds,
        judge=SHORTLIST_RULE,
    )
    merged = dataclasses.replace(
        again,
        points=first.points + again.points,
        seconds=first.seconds + again.seconds,
        rates=first.rates + again.rates,
    )
    return sorted([merged, *measured[1:]], key=lambda e: -e.rate)
