"""How a rate is judged from the runs measured at it: met the budget (True), missed it (False), or not
decided yet (None: measure once more). The search (``perf.tune.measured.measured_max_rate``) and the
operating point's confirmation (``perf.tune.operating``) measure at a rate until their rule decides.

On this shared machine one run at a rate reproduces its p99 within 20% in under half of the cases
(``perf.tune.tuner.RepeatSpread``), so the rule decides which draw a figure rests on:

- ``one_pass`` (the brute force's and the shortlist's): a pass counts, a miss is measured once more.
  Cheap, and what Model Analyzer does, but it keeps the luckiest of two draws.
- ``verdict`` (the confirmation's): a majority of up to ``MAJORITY_OF`` runs; two that agree decide.
- ``majority_kept_up`` (the head-to-head rematch's): ``verdict``, with a first run the server fell far
  behind on (``overloaded``) deciding a miss.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the session measures again what ``perf.tune.steal`` says, which uses ``OVERLOADED``
    from perf.tune.session import Observed

OVERLOADED = 0.9  # a miss whose server served less than this share of the offered rate is not repeated
MAJORITY_OF = 3  # at most this many runs at a rate; a majority of them decides
Judge = Callable[[Sequence["Observed"], float], "bool | None"]


def overloaded(run: Observed) -> bool:
    """A miss not worth measuring again: the server served less than ``OVERLOADED`` of the offered
    rate. A neighbour's burst costs a point its p99, not a tenth of its throughput: in one exhaustive
    tune (run 16: sweep, rematch and shortlist), of the 106 misses measured twice, the 14 whose first
    run served 28-87% of the offered rate served 29-91% in the repeat and none met the budget; the
    18 repeats that met it all followed a first run that had kept up (served 91-101%).
    """
    return bool(run.offered) and run.throughput < OVERLOADED * run.offered


def one_pass(runs: Sequence[Observed], budget_ms: float, repeat_within: float = math.inf) -> bool | None:
    """Met once one run met the budget; missed after two misses, or after one the server fell far
    behind on (``overloaded``) or whose p99 is beyond ``repeat_within`` × the budget (on a shared
    machine a miss can be a neighbour's doing, a pass cannot)."""
    if not runs:
        return None
    last = runs[-1]
    if last.meets(budget_ms):
        return True
    if len(runs) >= 2 or overloaded(last) or last.p99_ms > repeat_within * budget_ms:
        return False
    return None


def verdict(runs: Sequence[Observed], budget_ms: float) -> bool | None:
    """True once a majority of ``MAJORITY_OF`` met the budget (``Observed.meets``: p99, nothing
    failed, the server kept up), False once a majority missed it, None while undecided: two runs that
    agree decide, a third breaks a tie (the median of three, robust to one disturbed run)."""
    majority = MAJORITY_OF // 2 + 1
    met = sum(run.meets(budget_ms) for run in runs)
    if met >= majority:
        return True
    if len(runs) - met >= majority:
        return False
    return None


def majority_kept_up(runs: Sequence[Observed], budget_ms: float) -> bool | None:
    """``verdict``, except that a first run the server fell far behind on decides a miss alone (none
    of 14 such repeats met the budget, ``overloaded``): the head to head's rule, so that neither
    configuration's figure rests on one lucky run. In exhaustive run 34 the sweep's best got its
    4,777/s from the one run of six at that rate that met 10 ms (10.3, 11.1, 15.1, 19.1, 23.9, 9.3 ms
    over sweep and rematch) and its rematch figure from one 9.8 ms run; the pick then came out at 54%."""
    if len(runs) == 1 and overloaded(runs[0]):
        return False
    return verdict(runs, budget_ms)
