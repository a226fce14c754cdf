"""Runs the hypervisor took CPU from, measured again.

These machines are virtual: when the host runs other guests, a CPU of ours that has work waits, and
``/proc/stat`` counts that wait as steal. A stall of tens of milliseconds is the whole tail of a 10 ms
budget. Measured here (the method of ``python -m perf.tune.steal_check``: the recommender,
``max 32, 1 ms ×1``, perf_analyzer, runs of 2.5 s one after the other, nothing measured again): at
1,800/s, of 60 runs, the 32 with 0.5% or more of the CPUs' time stolen had a p99 of 7.3-96.9 ms
(median 18.1), 28 of them over 10 ms; the other 28 had 6.6-33.6 ms (median 8.0), 2 over. At 2,200/s,
that configuration's knee, of 95 runs the 23 stolen all missed 10 ms (10.6-25.9 ms, median 15.6), the
other 72 missed in 47 (6.6-25.6, median 10.7): there the model's own tail is a coin flip, steal makes
it a miss. Steal came in stretches of 30-70 s, up to 28% of the CPUs' time.

Such a run measures the host's other guests, not the configuration, and any rule counts it as a miss:
one of them at a bisection's first point halves a sustainable rate. So every run of the tuner, the
brute force and the rematch alike, whose stolen share reached ``STOLEN_LIMIT`` is measured again,
until one is not or the runs measured again took ``STOLEN_WAIT_S``; then the last counts, flagged. A
time, not a count: in one exhaustive tune the steal lasted about four minutes at 4-39% of the CPUs'
time (most of both verification passes), and three reruns per run moved on through it, counting the
host's noise (p99 17-824 ms where the prediction said 6-13); the stretch passes in the same time
whether the tuner measures through it or waits it out. Not measured again: a run the server fell
further behind on than the stolen share explains (losing a tenth of the CPUs' time costs at most about
a tenth of the capacity; an overloaded point, ``no batching`` at 3,666/s with 10.6% stolen and p99 2.5
s, misses whatever the host does, and re-measuring such points only lengthened the brute force). The
report lists the runs measured again and the seconds they took, and judges the tuner's time against
the brute force's without them, since a stretch lands on one or the other by chance.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from perf.markdown import number
from perf.tune.rules import OVERLOADED

STOLEN_LIMIT = 0.005  # share of the CPUs' time stolen over a run from which it is measured again
STOLEN_WAIT_S = 120.0  # at most this many seconds of runs measured again; then the last counts as it is
STOLEN_STREAK = 3  # measurements in a row still stolen after their whole wait (``Patience``)
STOLEN_STREAK_S = 3 * STOLEN_WAIT_S  # ... and the seconds they measured again together, at least


class Run(Protocol):
    label: str
    stolen_share: float
    wall_s: float
    offered: float

    @property
    def p99_ms(self) -> float: ...

    @property
    def throughput(self) -> float: ...


R = TypeVar("R", bound=Run)
T = TypeVar("T")


def stolen(run: Run) -> bool:
    """The hypervisor took at least ``STOLEN_LIMIT`` of the CPUs' time during ``run`` (False without a
    reading: where ``/proc/stat`` has no steal counter, nothing is measured again)."""
    return run.stolen_share >= STOLEN_LIMIT


def share_taken(run: Run) -> float:
    """The share of the CPUs' time the hypervisor took during ``run``; 0 without a reading."""
    return run.stolen_share if math.isfinite(run.stolen_share) else 0.0


def stolen_pct(runs: Sequence[Run]) -> list[float]:
    """Each run's share of the CPUs' time the hypervisor took, in % (0 without a reading): what
    ``figures.json`` lists next to the p99s it quotes."""
    return [100 * share_taken(run) for run in runs]


def unstolen_first(items: Sequence[T], run_of: Callable[[T], Run] = lambda item: item) -> list[T]:
    """Those of ``items`` whose run (``run_of``) the hypervisor did not take CPU from, or all of them
    where it took from every one: what a calibration fits to. A run still stolen after the wait
    measured the host's other guests as much as the machine (``python -m perf.tune.steal_check``, 15
    runs of one configuration at 1,000/s: 14 stolen, p99 7.5-50.3 ms, median 18.2; the one not, 9.3 ms)."""
    kept = [item for item in items if not stolen(run_of(item))]
    return kept or list(items)


def p99_with_steal(run: Run) -> str:
    """A run's p99 for a report, with the share of the CPUs' time the hypervisor took if it did."""
    if not stolen(run):
        return number(run.p99_ms)
    return f"{number(run.p99_ms)} ({number(100 * run.stolen_share)}% stolen)"


def counted_stolen(runs: Sequence[Run]) -> str:
    """Of the ``runs`` a measured figure comes from, how many counted although stolen from, for a
    report or the console ("" where none did): the figure then holds the host's other guests, and a
    reader comparing it with a prediction must know that first."""
    taken = sum(stolen(run) for run in runs)
    if not taken:
        return ""
    return (
        f"{taken} of the {len(runs)} counted although stolen from, so the measured p99 holds "
        "the host's steal as well as the configuration (`python -m perf.tune.steal_check` measures how much)"
    )


def behind_beyond_steal(run: Run) -> bool:
    """The server served less of the offered rate than ``overloaded`` allows, by more than the stolen
    share: the point is beyond the configuration's capacity, steal or not."""
    return bool(run.offered) and run.throughput < (OVERLOADED - run.stolen_share) * run.offered


def worth_measuring_again(run: Run) -> bool:
    """``stolen``, and not ``behind_beyond_steal``."""
    return stolen(run) and not behind_beyond_steal(run)


def unstolen(
    measure: Callable[[], R],
    wait_s: float = STOLEN_WAIT_S,
    discarding: Callable[[R, list[R]], None] | None = None,
) -> tuple[R, list[R]]:
    """``measure()`` again while a run is ``worth_measuring_again``, until the runs measured again took
    ``wait_s`` (0: never): the run that counts and the ones measured again (in order). ``discarding``
    hears of each run set aside (with those set aside so far, it included) before the next is measured."""
    run, again, spent = measure(), [], 0.0
    while worth_measuring_again(run) and spent < wait_s:
        again.append(run)
        spent += run.wall_s
        if discarding:
            discarding(run, again)
        run = measure()
    return run, again


@dataclass
class Patience:
    """Whether a session still waits out the hypervisor's steal. On a host stolen from throughout every
    measurement waits its whole ``STOLEN_WAIT_S`` and then counts stolen all the same: the wait buys
    nothing, and an exhaustive tune (over 300 measurements) takes hours (``steal_check --rate 1000
    --runs 15``, five checks over two and a half hours of one morning: 14 or 15 of 15 runs stolen each
    time). Once the whole wait ran out for at least ``STOLEN_STREAK`` measurements in a row, which
    measured again for at least ``STOLEN_STREAK_S`` of runs together, the session stops waiting, and a
    run that comes out not stolen starts it again. Both: three 5 s waits (the tests') are no sign of
    anything, and one wait of ten minutes is what its caller asked for. The stretches of steal measured
    on quieter nights (30-70 s, once about four minutes, in run 41) end before three whole default
    waits (six minutes) do."""

    streak: int = 0  # measurements in a row counted still stolen after their whole wait
    streak_s: float = 0.0  # the seconds those measured again
    unwaited: int = 0  # runs counted stolen, not measured again, while the session did not wait

    @property
    def waiting(self) -> bool:
        return self.streak < STOLEN_STREAK or self.streak_s < STOLEN_STREAK_S

    def wait_for(self, wait_s: float) -> float:
        """The wait for the next measurement, where its caller asked for ``wait_s``."""
        return wait_s if self.waiting else 0.0

    def counted(self, run: Run, again: Sequence[Run], wait_s: float) -> str | None:
        """Take note of the ``run`` that counted for a measurement whose caller asked for ``wait_s``,
        after the runs measured ``again``: a line for the console where the session stops or starts
        waiting again, else None. A caller that never waits (``--follow``'s trace) says nothing of the
        host."""
        if wait_s <= 0:
            return None
        if not stolen(run):
            resumed = not self.waiting
            self.streak, self.streak_s = 0, 0.0
            return "a run not stolen: stolen runs are measured again from here on" if resumed else None
        if not worth_measuring_again(run):  # beyond capacity whatever the host does: no verdict on it
            return None
        if not self.waiting:
            self.unwaited += 1
            return None
        self.streak += 1  # still worth measuring again: the whole wait ran out
        self.streak_s += sum(discarded.wall_s for discarded in again)
        if self.waiting:
            return None
        return (
            f"the whole wait ran out for {self.streak} measurements in a row ({self.streak_s:.0f} s of "
            "runs stolen): the host is stolen from throughout, so runs now count as measured, stolen or "
            "not, until one is not stolen (the report counts them)"
        )


@dataclass(frozen=True)
class Rerun:
    """One measurement that the hypervisor disturbed: the runs measured again, and the one that counted
    (itself stolen when every rerun was)."""

    discarded: tuple[Run, ...]
    counted: Run


def stolen_figures(
    reruns: Sequence[Rerun], runs: int, wait_s: float = STOLEN_WAIT_S, unwaited: int = 0
) -> dict:
    """The report's figures on ``reruns`` out of ``runs`` measurements, each measured again for at most
    ``wait_s`` (the session's), and ``unwaited`` counted stolen without a wait (``Patience``)."""
    discarded = [run for rerun in reruns for run in rerun.discarded]
    return {
        "limit": STOLEN_LIMIT,
        "wait_s": wait_s,
        "measurements": runs,
        "measured_again": len(reruns),
        "runs_discarded": len(discarded),
        "seconds": sum(run.wall_s for run in discarded),
        "counted_stolen": sum(stolen(rerun.counted) for rerun in reruns),
        "streak": STOLEN_STREAK,
        "streak_s": STOLEN_STREAK_S,
        "counted_stolen_unwaited": unwaited,
        "p99_ms_discarded": [run.p99_ms for run in discarded],
        "p99_ms_counted": [rerun.counted.p99_ms for rerun in reruns],
        "stolen_pct_discarded": [100 * run.stolen_share for run in discarded],
    }


STOLEN_HEADING = "## Runs the hypervisor took CPU from (`perf.tune.steal`)"


def stolen_summary(figures: dict) -> str:
    """One line for the console on the runs a session measured again (``stolen_figures``); "" if none."""
    if not figures["measured_again"]:
        return ""
    still = figures["counted_stolen"] + figures["counted_stolen_unwaited"]
    return (
        f"steal: {figures['measured_again']} of {figures['measurements']} measurements measured again "
        f"({figures['seconds']:.0f} s of runs discarded), {still} counted still stolen (report: "
        "*Runs the hypervisor took CPU from*)"
    )


def stolen_paragraph(figures: dict) -> str:
    """The report's words on the runs measured again (``stolen_figures``)."""
    limit = f"{100 * figures['limit']:.1f}% or more of the CPUs' time stolen"
    if not figures["measured_again"]:
        return f"None of the {figures['measurements']} measurements had {limit}."
    discarded, counted = figures["p99_ms_discarded"], figures["p99_ms_counted"]
    shares = figures["stolen_pct_discarded"]
    return (
        f"{figures['measured_again']} of {figures['measurements']} measurements had {limit} (steal in "
        f"`/proc/stat`) and were measured again, for at most {figures['wait_s']:.0f} s each: "
        f"{figures['runs_discarded']} runs ({figures['seconds']:.0f} s) discarded, stolen "
        f"{min(shares):.1f}-{max(shares):.1f}%, p99 median {statistics.median(discarded):.1f} ms; the "
        f"runs that counted instead: p99 median {statistics.median(counted):.1f} ms. "
        f"{figures['counted_stolen']} counted although still stolen after that long."
        + unwaited_sentence(figures)
    )


def unwaited_sentence(figures: dict) -> str:
    """The runs counted stolen without a wait, where the host was stolen from throughout (``Patience``)."""
    if not figures["counted_stolen_unwaited"]:
        return ""
    unwaited = figures["counted_stolen_unwaited"]
    return (
        f" After {figures['streak']} of those in a row, {figures['streak_s']:.0f} s of runs stolen or "
        "more, the host counted as stolen from throughout: "
        f"{unwaited} more measurement{'s' if unwaited > 1 else ''} counted a stolen run without measuring "
        "it again (waiting starts again at the first run not stolen); their figures hold the host's steal."
    )
