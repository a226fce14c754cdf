"""Study profiles: what ``make perf`` measures, and for how long. ``PERF=quick`` is the 1–2 minute one.

Every field can be overridden from the command line (``python -m perf run --help``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from perf.measure import MeasureSettings
from perf.study_spec import FAMILIES, MODES


@dataclass(frozen=True)
class Profile:
    name: str
    families: tuple[str, ...] = tuple(FAMILIES)
    modes: tuple[str, ...] = tuple(MODES)
    concurrencies: tuple[int, ...] = (1, 4, 16, 32)
    goal_concurrency: int = 16  # the concurrency of the "dynamic vs none" goal
    poisson_fraction: float = 0.8  # open-loop rate as a fraction of measured dynamic-batching capacity
    settings: MeasureSettings = field(default_factory=MeasureSettings)
    raw_batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    raw_seconds: float = 0.5
    protocol: str = "grpc"
    shared_memory: bool = False
    seed: int = 0
    perf_analyzer: bool = True  # cross-check with perf_analyzer when a working binary is installed
    trace: str | None = None  # a file of inter-arrival times to replay instead of Poisson arrivals

    def __post_init__(self) -> None:
        if not self.poisson_fraction > 0:  # a rate of 0 has no arrivals: the open loop would never end
            raise ValueError(f"poisson_fraction (--rate-fraction) must be > 0, got {self.poisson_fraction}")
        if self.goal_concurrency not in self.concurrencies:
            object.__setattr__(
                self, "concurrencies", tuple(sorted({*self.concurrencies, self.goal_concurrency}))
            )


PROFILES: dict[str, Profile] = {
    "default": Profile(
        "default", settings=MeasureSettings(warmup_s=1.0, window_s=1.25, stable_windows=3, max_windows=5)
    ),
    "quick": Profile(
        "quick",
        families=("recommender",),
        concurrencies=(1, 16),
        settings=MeasureSettings(warmup_s=0.5, window_s=0.75, stable_windows=3, max_windows=3),
        raw_batch_sizes=(1, 4, 16, 32),
        raw_seconds=0.25,
    ),
    # What the integration test runs: seconds, not minutes; the numbers are not meant to be stable.
    "smoke": Profile(
        "smoke",
        families=("recommender",),
        modes=("none", "static32", "dyn1ms"),
        concurrencies=(4,),
        goal_concurrency=4,
        settings=MeasureSettings(warmup_s=0.2, window_s=0.4, stable_windows=2, max_windows=2),
        raw_batch_sizes=(1, 32),
        raw_seconds=0.1,
    ),
}


def get_profile(name: str, **overrides: object) -> Profile:
    """A named profile with ``overrides`` (fields of ``Profile`` or ``MeasureSettings``) applied."""
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; choose from {', '.join(PROFILES)}")
    profile = PROFILES[name]
    settings = {k: v for k, v in overrides.items() if k in MeasureSettings.__dataclass_fields__}
    rest = {k: v for k, v in overrides.items() if k not in settings}
    if settings:
        rest["settings"] = replace(profile.settings, **settings)
    return replace(profile, **rest)
