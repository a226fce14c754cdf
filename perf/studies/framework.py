"""What every study of ``make perf`` stands on: one ``Profile``, one way to call and measure a model, one
place a report is written (docs/PERF.md, "Writing a new study")."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from exporters.schema.models import ModelSpec
from perf import markdown
from perf.measure.engine import LoadEngine, MeasureSettings
from perf.measure.loads import Load, poisson, read_trace
from perf.measure.measurement import Measurement, measure
from perf.measure.target import Target, target_from_spec
from perf.studies.goals import Goal
from perf.studies.profiles import Profile
from server import ServerOptions, TritonServer

log = logging.getLogger(__name__)
Progress = Callable[[str], None]  # called as each step starts, with what it is (every study)


@dataclass(frozen=True)
class StudyContext:
    """What a study gets from ``make perf`` (a test hands in a ``measurement`` that records its loads)."""

    profile: Profile
    folder: Path  # the run's report folder: the study writes <name>.md, <name>.json, its server log
    workdir: Path  # scratch space (repositories); the study removes what it makes here
    spec_path: Path = Path("models.yaml")  # the user's spec (``--spec``), for studies that serve it
    progress: Progress = field(default=lambda step: None)
    measurement: Callable[..., Measurement] = measure

    def server(self, repository: Path, log_name: str, **options: Any) -> TritonServer:
        """A ``TritonServer`` logging into the report folder; ``options``: more ``ServerOptions``."""
        return TritonServer(ServerOptions(repository=repository, log_path=self.folder / log_name, **options))

    def url(self, server: TritonServer) -> str:
        return server.grpc_url if self.profile.protocol == "grpc" else server.http_url

    def target(
        self, server: TritonServer, spec: ModelSpec, served_as: str = "", collect: int = 1, rows: int = 64
    ) -> Target:
        """``spec``'s model called as the profile says; ``served_as``: the served name where it differs
        (a pipeline takes the inputs of the model it splits); ``collect``: client-side static batching."""
        p = self.profile
        target = target_from_spec(
            spec, self.url(server), p.protocol, collect, p.shared_memory, p.seed, max(collect, rows)
        )
        return replace(target, model=served_as) if served_as else target

    def measure(
        self, server: TritonServer, target: Target, load: Load, label: str = "", related: Sequence[str] = (),
        settings: MeasureSettings | None = None, engine: LoadEngine | None = None,
    ) -> Measurement:  # fmt: skip
        """``measure`` with the profile's windows (or ``settings``: rare events need a fixed, longer run);
        ``related`` models (an ensemble's steps) are read over the same windows."""
        label = label or f"{target.model} @ {load.name}"
        self.progress(label)
        windows = settings or self.profile.settings
        result = self.measurement(target, load, windows, server, label, tuple(related), engine)
        summary = result.summary()
        log.info("%s: %.0f inf/s, p99 %.1f ms, %d failed", label, summary.throughput, summary.p99_ms,
                 summary.failed)  # fmt: skip
        failure = next((r.status for r in result.records if not r.ok), None)
        if failure:
            log.warning("%s: requests failed; the first: %s", label, failure)
        return result

    def open_load(self, rate: float, seed_offset: int = 0) -> Load:
        """The profile's trace, else Poisson at ``rate`` (``seed_offset``: for a phase of other arrivals)."""
        if self.profile.trace:
            return read_trace(self.profile.trace)
        return poisson(rate, self.profile.seed + seed_offset)


@dataclass(frozen=True)
class SummaryTable:
    """A table for the console at the end of a study: plain text cells, laid out by ``perf.cli``."""

    title: str
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class StudyReport:
    """A study's report and goals; the console shows its ``summary`` tables where it has them."""

    name: str
    title: str
    path: Path  # <folder>/<name>.md
    goals: list[Goal]
    summary: tuple[SummaryTable, ...] = ()


class Study(Protocol):
    """A study of ``make perf`` (docs/PERF.md, "Writing a new study")."""

    name: str  # file stem of its report: <name>.md, <name>.json
    title: str  # one line for the console
    serves_spec: bool  # serves models of ``context.spec_path``: ``--spec`` must exist when it runs

    def steps(self, profile: Profile) -> int:
        """Progress steps ``run`` will report (0: the profile does not ask for this study)."""

    def run(self, context: StudyContext) -> StudyReport:
        """Build, serve, measure, judge, write; the server is stopped whatever happens."""


def write_report(
    context: StudyContext, study: Study, lines: Sequence[str], goals: list[Goal], figures: dict[str, Any]
) -> StudyReport:
    """``<name>.json`` (first: it survives a failing render) and ``<name>.md``."""
    path = markdown.write_report(context.folder / f"{study.name}.md", lines, figures)
    return StudyReport(study.name, study.title, path, goals)
