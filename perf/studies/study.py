"""The batching study's run, all on one server so that ratios compare like with like (docs/PERF.md,
"Order of work")."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from exporters.repository import build_repository
from perf.measure.analyzer import PerfAnalyzerEngine, find_perf_analyzer, glibc_version
from perf.measure.engine import LoadEngine
from perf.measure.loads import Load, closed_loop
from perf.measure.measurement import Measurement
from perf.measure.raw import RawPoint, measure_raw
from perf.measure.target import Target
from perf.studies.framework import StudyContext
from perf.studies.profiles import Profile
from perf.studies.study_spec import MODES, TRIVIAL, model_name, study_spec
from server import TritonServer

log = logging.getLogger(__name__)


@dataclass
class FamilyResult:
    family: str
    sweep: dict[str, list[Measurement]] = field(default_factory=dict)  # mode -> by concurrency
    open_loop: dict[str, Measurement] = field(default_factory=dict)  # mode -> same arrivals
    open_load: Load | None = None
    open_loop_note: str = ""  # why the open loop did not run, if it did not
    capacity: float = 0.0
    raw: list[RawPoint] = field(default_factory=list)


@dataclass
class StudyResult:
    profile: Profile
    repository: Path
    started: datetime
    finished: datetime | None = None
    ceiling: list[Measurement] = field(default_factory=list)
    families: dict[str, FamilyResult] = field(default_factory=dict)
    server_log: Path | None = None
    cross_check: list[tuple[Measurement, Measurement]] = field(default_factory=list)  # (perf_analyzer, ours)
    analyzer_note: str = ""


@dataclass(frozen=True)
class StudyTools:
    """The raw backend and perf_analyzer the study measures with (a test hands in its own)."""

    measure_raw: Callable[..., list[RawPoint]] = measure_raw
    perf_analyzer: Callable[[], Path | None] = find_perf_analyzer
    analyzer_engine: Callable[..., LoadEngine] = PerfAnalyzerEngine


def sweep_loads(profile: Profile, mode: str) -> list[Load]:
    """A mode's closed loops; static batching's in whole batches in flight (and two)."""
    collect = MODES[mode].collect
    if collect == 1:
        return [closed_loop(c) for c in profile.concurrencies]
    # Two batches in flight as well: with one, the server idles while each response travels back.
    in_flight = sorted({max(1, c // collect) for c in profile.concurrencies} | {2})
    return [closed_loop(n * collect) for n in in_flight]


def count_steps(profile: Profile) -> int:
    """Steps the progress bar will see: build, start, one per measurement, one per raw reference."""
    per_family = sum(len(sweep_loads(profile, m)) for m in profile.modes) + len(profile.modes) + 1
    return 2 + len(profile.concurrencies) + per_family * len(profile.families)


class StudyRunner:
    """Runs the context's profile against one server; ``run`` returns everything measured."""

    def __init__(self, context: StudyContext, tools: StudyTools = StudyTools()) -> None:
        self.context = context
        self.profile = profile = context.profile
        self.tools = tools
        self.spec = study_spec(
            list(profile.families), list(profile.modes), profile.seed, profile.family_table
        )
        self.repository = context.workdir / "repository"
        self.collect = {model_name(f, m): MODES[m].collect for f in profile.families for m in profile.modes}

    def target(self, server: TritonServer, model: str) -> Target:
        rows = max(self.profile.raw_batch_sizes)  # the raw reference sends these inputs too
        return self.context.target(server, self.spec.model(model), "", self.collect.get(model, 1), rows)

    def _measure(
        self, server: TritonServer, model: str, load: Load, label: str = "", engine: LoadEngine | None = None
    ) -> Measurement:
        """``model`` under ``load``, labelled ``<model> @ <load>`` unless ``label`` says otherwise."""
        return self.context.measure(server, self.target(server, model), load, label, engine=engine)

    def run(self) -> StudyResult:
        result = StudyResult(self.profile, self.repository, datetime.now())
        self.context.progress("building the study repository")
        build_repository(self.spec, self.repository, num_gpus=0)
        self.context.progress("starting tritonserver")
        with self.context.server(self.repository, "server.log") as server:
            result.server_log = server.log_path
            for concurrency in self.profile.concurrencies:
                result.ceiling.append(self._measure(server, TRIVIAL, closed_loop(concurrency)))
            for family in self.profile.families:
                result.families[family] = self._run_family(server, family)
            self._cross_check(server, result)
        result.finished = datetime.now()
        return result

    def _cross_check(self, server: TritonServer, result: StudyResult) -> None:
        if not self.profile.perf_analyzer:
            result.analyzer_note = "Off in this profile."
            return
        binary = self.tools.perf_analyzer()
        if binary is None:
            result.analyzer_note = (
                f"perf_analyzer is not installed here (glibc {glibc_version()}; its PyPI build needs 2.38); "
                "`make perf-analyzer` says how to get it."
            )
            return
        modes = self.profile.modes
        dynamic = next((m for m in modes if MODES[m].max_queue_delay_ms is not None), modes[0])
        model = model_name(self.profile.families[0], dynamic)
        load = closed_loop(self.profile.goal_concurrency)
        try:  # a reference only: its failure must not throw away the study measured before it
            engine = self.tools.analyzer_engine(binary, log_folder=self.context.folder)
            theirs = self._measure(server, model, load, f"{model} @ {load.name} (perf_analyzer)", engine)
            ours = self._measure(server, model, load, f"{model} @ {load.name} (next to perf_analyzer)")
        except Exception as error:
            log.exception("perf_analyzer cross-check on %s failed", model)
            result.analyzer_note = (
                f"The perf_analyzer cross-check on {model} failed: {type(error).__name__}: {error}"
            )
            return
        result.cross_check.append((theirs, ours))

    def _run_family(self, server: TritonServer, family: str) -> FamilyResult:
        out = FamilyResult(family)
        # Concurrency-major, modes interleaved: drift on the shared machine hits all modes alike.
        plan = sorted(
            ((load.concurrency, index, mode, load)
             for index, mode in enumerate(self.profile.modes) for load in sweep_loads(self.profile, mode)),
            key=lambda item: item[:2],
        )  # fmt: skip
        out.sweep = {mode: [] for mode in self.profile.modes}
        for _, _, mode, load in plan:
            out.sweep[mode].append(self._measure(server, model_name(family, mode), load))
        out.capacity = capacity(out.sweep)
        if self.profile.trace or out.capacity > 0:
            out.open_load = self.context.open_load(self.profile.poisson_fraction * out.capacity)
        else:
            out.open_loop_note = (
                "The open loop did not run: the closed-loop sweep measured no throughput (every request "
                "failed?), so there is no capacity to set a Poisson rate from."
            )
            log.warning("%s: capacity 0, open loop skipped", family)
        for mode in self.profile.modes if out.open_load else ():
            out.open_loop[mode] = self._measure(server, model_name(family, mode), out.open_load)
        self.context.progress(f"{family}: raw onnxruntime")
        reference = self.spec.model(model_name(family, self.profile.modes[0]))
        out.raw = self.tools.measure_raw(
            self.repository / reference.name / "1" / "model.onnx", self.target(server, reference.name).inputs,
            self.profile.raw_batch_sizes, reference.threads.intra_op, reference.threads.inter_op,
            self.profile.raw_seconds,
        )  # fmt: skip
        return out


def capacity(sweep: dict[str, list[Measurement]]) -> float:
    """The best closed-loop throughput of the single-instance dynamic modes (any mode if none ran)."""
    dynamic = [m for m in sweep if MODES[m].max_queue_delay_ms is not None and MODES[m].instances == 1]
    chosen = dynamic or list(sweep)
    return max(x.summary().throughput for mode in chosen for x in sweep[mode])
