"""Host noise as one measurement policy: a run whose stolen share reached ``stolen_limit`` is measured
once more and the less stolen counts (docs/TUNE.md, "Host noise"); the search knows nothing of steal."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from perf.measure.measurement import Measurement

log = logging.getLogger(__name__)
STOLEN_LIMIT = 0.005  # of the CPUs' time: from 0.5% stolen over a run, the run holds the host's noise


@dataclass(frozen=True)
class Remeasured:
    """A run set aside for the host's steal, and the one measured in its place."""

    label: str
    stolen_share: float
    p99_ms: float
    seconds: float
    again_stolen_share: float
    again_p99_ms: float


@dataclass(frozen=True)
class NoiseFigures:
    """The policy's account of a run of measurements, as a saved result keeps it."""

    stolen_limit: float
    runs: int  # measurements taken through the policy
    remeasured: tuple[Remeasured, ...]  # those measured once more for the host's steal
    remeasured_s: float  # what measuring them again took


@dataclass
class NoisePolicy:
    stolen_limit: float = STOLEN_LIMIT
    remeasure: bool = True  # False: only mark (a tool that studies the noise itself)
    runs: int = 0  # measurements taken through the policy
    remeasured: list[Remeasured] = field(default_factory=list)

    def holds_noise(self, run: Measurement) -> bool:
        """The hypervisor took at least ``stolen_limit`` of the CPUs' time (False without a reading)."""
        share = run.stolen_share
        return math.isfinite(share) and share >= self.stolen_limit

    def measure(self, take: Callable[[], Measurement]) -> Measurement:
        """``take()``, and once more where the first run holds noise: the less stolen counts."""
        self.runs += 1
        first = take()
        if not (self.remeasure and self.holds_noise(first)):
            return first
        again = take()
        stolen = (first.stolen_share, first.p99_ms, first.wall_s, again.stolen_share, again.p99_ms)
        self.remeasured.append(Remeasured(first.label, *stolen))
        words = "%s: %.1f%% of the CPUs' time stolen (p99 %.1f ms); measured again: %.1f%% (p99 %.1f ms)"
        shares = 100 * first.stolen_share, first.p99_ms, 100 * again.stolen_share, again.p99_ms
        log.info(words, first.label, *shares)
        return again if not again.stolen_share > first.stolen_share else first

    def account(self) -> NoiseFigures:
        """The policy's account for a saved result."""
        again = tuple(self.remeasured)
        return NoiseFigures(self.stolen_limit, self.runs, again, float(sum(r.seconds for r in again)))
