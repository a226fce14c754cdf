"""Study profiles: what ``make perf`` measures, and for how long. One ``Profile`` drives every study,
a study's own knobs included, and is checked before any folder is made or anything is built."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from perf.errors import OptionError, check_at_least
from perf.measure.engine import MeasureSettings
from perf.measure.target import PROTOCOLS
from perf.studies.study_spec import COMPARISONS, FAMILIES, MODES, TEXT_MODES


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
    # The pipeline study (pipelines saturate at 0.5–0.8× of the monolithic model's capacity here).
    pipelines: tuple[str, ...] = tuple(COMPARISONS)
    pipeline_load_fraction: float = 0.5
    live_updates: int = 20
    # The text-embedding study (no modes: not run).
    text_modes: tuple[str, ...] = ("none", "exact", "buckets", "longest")
    text_corpus: int = 512
    text_reference_texts: int = 128
    text_int8: bool = True  # also serve the int8 encoder (buckets) and compare it with fp32
    queue_policy_s: float = 12.0  # the queue-policy study's span per configuration and load (0: not run)
    spec_families: dict[str, dict[str, Any]] = field(default_factory=dict)  # models of --spec, as families

    @property
    def family_table(self) -> dict[str, dict[str, Any]]:
        """Every family this profile may measure: the zoo's and the user's."""
        return {**FAMILIES, **self.spec_families}

    def __post_init__(self) -> None:
        _known("models (--models)", self.families, self.family_table)
        _known("modes (--modes)", self.modes, MODES)
        _known("pipelines", self.pipelines, COMPARISONS)
        _known("text modes", self.text_modes, TEXT_MODES)
        _known("protocol (--protocol)", (self.protocol,), PROTOCOLS)
        if self.text_corpus < 16 or not 1 <= self.text_reference_texts <= self.text_corpus:
            raise OptionError(
                f"text_corpus must be >= 16 and text_reference_texts in 1..text_corpus, got "
                f"{self.text_corpus} and {self.text_reference_texts}"
            )
        if not self.modes or not self.families:
            raise OptionError("a study needs at least one model (--models) and one mode (--modes)")
        if any(c < 1 for c in (*self.concurrencies, self.goal_concurrency)):
            raise OptionError(
                f"concurrencies must be >= 1, got --concurrency {list(self.concurrencies)}, "
                f"--goal-concurrency {self.goal_concurrency}"
            )
        for name in ("poisson_fraction", "pipeline_load_fraction"):
            # a rate of 0 has no arrivals: the open loop would never end
            if not getattr(self, name) > 0:
                raise OptionError(f"{name} (--rate-fraction) must be > 0, got {getattr(self, name)}")
        check_at_least((("queue_policy_s", self.queue_policy_s, 0), ("live_updates", self.live_updates, 0)))
        if self.trace is not None and not Path(self.trace).is_file():
            raise OptionError(f"trace (--trace) {self.trace!r} is not a file")
        if self.goal_concurrency not in self.concurrencies:
            object.__setattr__(
                self, "concurrencies", tuple(sorted({*self.concurrencies, self.goal_concurrency}))
            )


def _known(what: str, names: tuple[str, ...], known: Collection[str]) -> None:
    unknown = [n for n in names if n not in known]
    if unknown:
        raise OptionError(f"unknown {what}: {', '.join(unknown)}; choose from {', '.join(known)}")


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
        pipelines=("recommender_pipeline", "image_classifier_pipeline", "image_classifier_pipeline_fp16"),
        live_updates=10,
        text_modes=("none", "buckets", "longest"),
        text_corpus=256,
        text_reference_texts=64,
        queue_policy_s=6.0,
    ),
    # What the integration test runs: seconds, not minutes (windows sized for a p99 of 20 requests, not 100)
    "smoke": Profile(
        "smoke",
        families=("recommender",),
        modes=("none", "static32", "dyn1ms"),
        concurrencies=(4,),
        goal_concurrency=4,
        settings=MeasureSettings(warmup_s=0.2, window_s=0.4, stable_windows=2, max_windows=2, p99_samples=20),
        raw_batch_sizes=(1, 32),
        raw_seconds=0.1,
        pipelines=(),  # the smoke test checks the batching study; the pipeline study has its own tests
        text_modes=(),  # and the text study too (tests/integration/test_text_study.py)
        queue_policy_s=0.0,  # and the queue-policy study too (tests/integration/test_queue_policy_study.py)
    ),
}


def get_profile(name: str, **overrides: object) -> Profile:
    """A named profile with ``overrides`` (fields of ``Profile`` or ``MeasureSettings``): ``families``
    also narrows the pipelines, and ``poisson_fraction`` sets their fixed load, unless those are given."""
    if name not in PROFILES:
        raise OptionError(f"unknown profile {name!r}; choose from {', '.join(PROFILES)}")
    profile = PROFILES[name]
    unknown = set(overrides) - set(Profile.__dataclass_fields__) - set(MeasureSettings.__dataclass_fields__)
    if unknown:
        raise OptionError(f"unknown profile fields: {', '.join(sorted(unknown))}")
    settings = {k: v for k, v in overrides.items() if k in MeasureSettings.__dataclass_fields__}
    rest = {k: v for k, v in overrides.items() if k not in settings}
    if "families" in rest and "pipelines" not in rest:
        models = set(rest["families"])  # type: ignore[arg-type]
        rest["pipelines"] = tuple(p for p in profile.pipelines if COMPARISONS[p].model in models)
    if "poisson_fraction" in rest and "pipeline_load_fraction" not in rest:
        rest["pipeline_load_fraction"] = rest["poisson_fraction"]
    if settings:
        rest["settings"] = replace(profile.settings, **settings)
    return replace(profile, **rest)
