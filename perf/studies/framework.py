"""What every study of ``make perf`` stands on: one ``Profile``, one way to call a model, one way to
measure it with the server's view, one kind of goal, one place a report is written.

A study is a small object with ``name``, ``title``, ``steps(profile)`` and ``run(context)``; it builds
what it serves, starts a server with ``context.server(...)``, measures with ``context.measure(...)``
(which honours the profile's protocol, shared memory, windows and seed, and reads the server's
statistics over the same windows), judges its figures with ``perf.studies.goals.GOALS`` and writes
``<name>.md`` / ``<name>.json`` into ``context.folder``. ``perf.studies.catalog.studies()`` lists the studies
in the order ``make perf`` runs them, the batching study first (studies import this module, the list
imports them); docs/PERF.md ("Writing a new study") shows a whole one.
"""

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
from perf.measure.server_view import ServerEndpoints
from perf.measure.target import Target
from perf.studies.goals import Goal
from perf.studies.profiles import Profile
from server import ServerOptions, TritonServer

log = logging.getLogger(__name__)
Progress = Callable[[str], None]  # called as each step starts, with what it is (every study)


@dataclass(frozen=True)
class StudyContext:
    """Everything a study gets from ``make perf``: the options, where to write, where to scratch, and
    how a load is measured (a test hands in a ``measurement`` that records its loads)."""

    profile: Profile
    folder: Path  # the run's report folder: the study writes <name>.md, <name>.json, its server log
    workdir: Path  # scratch space (repositories); the study removes what it makes here
    spec_path: Path = Path("models.yaml")  # the user's spec (``--spec``), for studies that serve it
    progress: Progress = field(default=lambda step: None)
    measurement: Callable[..., Measurement] = measure

    def server(self, repository: Path, log_name: str, **options: Any) -> TritonServer:
        """A ``TritonServer`` for ``repository`` (use as a context manager); its log goes into the
        report folder as ``log_name``. ``options`` are further ``ServerOptions`` fields."""
        return TritonServer(ServerOptions(repository=repository, log_path=self.folder / log_name, **options))

    def target(self, server: TritonServer, spec: ModelSpec, served_as: str | None = None) -> Target:
        """A ``Target`` for ``spec``'s model over the profile's protocol and shared memory, inputs drawn
        with the profile's seed (a pool of 64 rows). ``served_as`` names the served model when it differs
        (a pipeline that takes the same inputs as the model it splits)."""
        target = self.profile.target(server, spec, rows=64)
        return replace(target, model=served_as) if served_as else target

    def measure(
        self, server: TritonServer, target: Target, load: Load, label: str = "", related: Sequence[str] = (),
        settings: MeasureSettings | None = None, engine: LoadEngine | None = None,
    ) -> Measurement:  # fmt: skip
        """``perf.measure.measurement.measure`` with the profile's windows (or ``settings``: a study
        that counts rare events needs a fixed, longer run) and the server's view over the measured
        windows; ``related`` models (an ensemble's steps) get their statistics read over the same
        windows. ``engine``: what sends the load (default: our client)."""
        label = label or f"{target.model} @ {load.name}"
        self.progress(label)
        endpoints = ServerEndpoints.of(server)
        windows = settings or self.profile.settings
        result = self.measurement(target, load, windows, endpoints, label, tuple(related), engine)
        summary = result.summary()
        log.info("%s: %.0f inf/s, p99 %.1f ms, %d failed", label, summary.throughput, summary.p99_ms,
                 summary.failed)  # fmt: skip
        failure = next((r.status for r in result.records if not r.ok), None)
        if failure:
            log.warning("%s: requests failed; the first: %s", label, failure)
        return result

    def open_load(self, rate: float, seed_offset: int = 0) -> Load:
        """The profile's open loop: its trace (``--trace``) if given, else Poisson at ``rate`` seeded by
        the profile's seed (plus ``seed_offset``, for a phase that must not replay the same arrivals)."""
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
    """What a study hands back: its markdown report, its goals, and what the console shows of it: its
    ``summary`` tables and goals where it has tables (a report too long to print), else the report."""

    name: str
    title: str
    path: Path  # <folder>/<name>.md
    goals: list[Goal]
    summary: tuple[SummaryTable, ...] = ()


class Study(Protocol):
    """A study of ``make perf`` (the batching and pipeline studies are two; see docs/PERF.md)."""

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
    """``<name>.json`` (every figure, first: it survives a failing render) and ``<name>.md``."""
    path = markdown.write_report(context.folder / f"{study.name}.md", lines, figures)
    return StudyReport(study.name, study.title, path, goals)
