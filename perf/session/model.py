"""One real server for a whole tuning run, in explicit model-control mode: the tuner's ``Server``. The
model is built once at the grid's largest ``max_batch_size`` (so the Python backend's shared memory fits
every candidate); each candidate is a ``load_model`` with a config override, seconds where a rebuild and
restart take a minute. A server that dies raises ``ServerDiedError`` (exit status 1): the run is no
evidence about the configuration, and the commands keep its log. A pipeline's session reloads every
stage with each candidate's batching (the first waits the delay, later stages ``stage_batching``'s short
re-forming wait); its server view is the first stage's."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import shutil
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import tritonclient.http as httpclient
from google.protobuf import json_format

from client.infer import infer, timed_calls
from exporters.configs.model_config import ModelConfig
from exporters.configs.models import dynamic_batching
from exporters.pipelines.build import BuiltPipeline, build_pipelines
from exporters.pipelines.configs import stage_batching
from exporters.repository import build_repository
from exporters.schema.models import Batching, ModelSpec, PipelineSpec, Spec
from perf.errors import ServerDiedError
from perf.measure.engine import KEPT_CAP_S, P99_SAMPLES, LoadEngine, MeasureSettings
from perf.measure.loads import Load
from perf.measure.measurement import Measurement, measure
from perf.measure.noise import NoisePolicy
from perf.measure.server_view import usable_cores
from perf.measure.target import Target, target_from_spec
from perf.model.batcher import BatcherConfig
from perf.spec_overlay import candidate_spec, config_json
from server import ServerOptions, TritonServer, admin
from server.stubs import server_stubs
from server.supervisor import death_cause

log = logging.getLogger(__name__)
RETIRE_WAIT_S = 6.0  # after a reload, at most this long for the replaced instances' stubs to exit
TUNE_WINDOWS = MeasureSettings(warmup_s=0.5, window_s=0.8, stable_windows=3, max_windows=5, tolerance=0.10)
TIMED_BATCHES = 3  # the largest batch timed, median kept: one stall would size every window


def add_window_options(parser: argparse.ArgumentParser) -> None:
    """``--seconds`` and ``--p99-samples``: the measurement options ``make tune`` and ``make plan`` share."""
    parser.add_argument(
        "--seconds", type=float, default=3 * TUNE_WINDOWS.window_s,
        help="seconds the three measurement windows that count cover, per run (longer at a low rate: "
        "--p99-samples)",
    )  # fmt: skip
    parser.add_argument(
        "--p99-samples", type=int, default=None,
        help=f"requests a run's p99 must rest on to count as within the budget (default {P99_SAMPLES}); a "
        f"model that cannot serve them within {KEPT_CAP_S:g} s of windows needs a lower count, and gets "
        "a rougher p99",
    )  # fmt: skip


def bound_error(*checks: tuple[str, float | None, str, float]) -> str | None:
    """The first of ``(option, value, ">" or ">=", least)`` whose value (None: not given) is out of bounds."""
    for option, value, op, least in checks:
        if value is not None and (value <= least if op == ">" else value < least):
            return f"{option} must be {op} {least:g}, got {value}"
    return None


def window_usage_error(args: argparse.Namespace) -> str | None:
    """What is wrong with ``add_window_options``' values, if anything."""
    return bound_error(("--seconds", args.seconds, ">", 0), ("--p99-samples", args.p99_samples, ">=", 1))


def run_windows(windows: MeasureSettings, args: argparse.Namespace) -> MeasureSettings:
    """``windows`` as ``add_window_options`` asked."""
    samples = windows.p99_samples if args.p99_samples is None else args.p99_samples
    return dataclasses.replace(windows, window_s=args.seconds / windows.stable_windows, p99_samples=samples)


def windows_for(settings: MeasureSettings, largest_batch_s: float) -> MeasureSettings:
    """``settings`` with windows of at least ``window_batches`` batches of ``largest_batch_s``."""
    floor = settings.window_batches * largest_batch_s
    return settings if settings.window_s >= floor else dataclasses.replace(settings, window_s=floor)


class ModelSession:
    """Build, serve and reload one model; ``with ModelSession(...) as session``."""

    def __init__(
        self, spec: Spec, model: str, largest_batch: int, workdir: Path, engine: LoadEngine,
        settings: MeasureSettings = TUNE_WINDOWS, noise: NoisePolicy | None = None, seed: int = 0,
        keep_queue: bool = False,
    ) -> None:  # fmt: skip
        self.base: ModelSpec = spec.model(model)
        self.largest_batch = max(largest_batch, self.base.max_batch_size)
        self.workdir = workdir
        self.engine = engine
        self.settings = settings
        self.noise = noise or NoisePolicy(remeasure=settings.remeasure_stolen)
        self.seed = seed
        self.keep_queue = keep_queue
        self.server: TritonServer | None = None
        self.current: BatcherConfig | None = None
        self.cores = usable_cores()
        self.sent_to = self.base.name  # the model every run's requests go to
        self.buckets: tuple[int, ...] | None = None  # None: the spec's ``buckets:``
        self.vary_shapes = True
        self._sending: dict[tuple[tuple[int, ...] | None, bool], Target] = {}  # targets made, by options
        self.largest_batch_s = 0.0  # one request of the largest batch, timed at the start
        self.runs: list[Measurement] = []  # every run, in order (a failed tune reports them)
        self.related: tuple[str, ...] = ()  # models whose statistics each run reads beside the target's

    def __enter__(self) -> ModelSession:
        repository = self.workdir / "repository"
        build_spec = dataclasses.replace(self.base, max_batch_size=self.largest_batch, warmup=False)
        build_repository(Spec(models=(build_spec,)), repository, num_gpus=0)
        self.server = TritonServer(self._options(repository, [self.base.name])).start()
        try:  # one request of the largest batch, which every run's windows are sized by
            client = httpclient.InferenceServerClient(self.server.http_url, network_timeout=600.0)
            with contextlib.closing(client):
                took = timed_calls(
                    lambda: infer(client, "http", self.base.name, self.target.inputs), TIMED_BATCHES, 1
                )
        except BaseException:
            self.__exit__(None, None, None)
            raise
        self.largest_batch_s = statistics.median(took) / 1e3
        log.info("a batch of %d takes %.0f ms", self.largest_batch, 1e3 * self.largest_batch_s)
        return self

    def sized(self, settings: MeasureSettings) -> MeasureSettings:
        """``settings`` sized by the largest batch timed at the start: a stall in a run lengthens no other."""
        return windows_for(settings, self.largest_batch_s)

    def _options(self, repository: Path, load_models: list[str]) -> ServerOptions:
        log_path = self.workdir / "server.log"
        return ServerOptions(repository, load_models=load_models, log_path=log_path, startup_timeout_s=240)

    def __exit__(self, *exc_info: object) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    @property
    def model_file(self) -> Path:
        """The served ONNX file (the raw reference measures it in-process)."""
        return self.workdir / "repository" / self.base.name / "1" / "model.onnx"

    @property
    def target(self) -> Target:
        """Where the runs send and what, as ``use_buckets`` said last."""
        sending = (self.buckets, self.vary_shapes)
        if sending not in self._sending:
            assert self.server is not None
            made = target_from_spec(
                self.base, self.server.grpc_url, "grpc", seed=self.seed, rows=self.largest_batch,
                vary_shapes=self.vary_shapes, buckets=self.buckets,
            )  # fmt: skip
            self._sending[sending] = dataclasses.replace(made, model=self.sent_to)
        return self._sending[sending]

    def use_buckets(self, buckets: tuple[int, ...] | None, vary_shapes: bool = True) -> None:
        """Send the next runs padded to ``buckets`` (``()``: none; None: the spec's), or at one length."""
        self.buckets, self.vary_shapes = buckets, vary_shapes

    def died(self, during: str) -> ServerDiedError | None:
        """The server's death during ``during``, or None while it runs."""
        if self.server is None or self.server.process is None or (code := self.server.process.poll()) is None:
            return None
        cause = death_cause(code, self.server.log_tail(80))
        log.error("tritonserver died during %s: %s", during, cause)
        return ServerDiedError(
            f"tritonserver died during {during}: {cause}", cause, str(self.server.log_path)
        )

    @contextlib.contextmanager
    def watching(self, during: str) -> Iterator[None]:
        """Raise ``ServerDiedError`` where the server died during the block, whatever the block raised."""
        try:
            yield
        except Exception as error:
            if (dead := self.died(during)) is not None:
                raise dead from error
            raise
        if (dead := self.died(during)) is not None:
            raise dead

    def load(self, config: BatcherConfig) -> float:
        """Reload the model with ``config`` (unless loaded); the seconds it took."""
        if config == self.current:
            return 0.0
        assert self.server is not None
        started = time.perf_counter()
        with self.watching(f"the reload of {config.label}"):
            loaded, overrides = self._overrides(config)
            # a load starts stubs as a start does, and takes as long on a loaded host: not the client's 60 s
            timeout_s = self.server.options.startup_timeout_s
            client = httpclient.InferenceServerClient(self.server.http_url, network_timeout=timeout_s)
            with contextlib.closing(client):
                for name, override in overrides.items():
                    admin.load_model(client, self.server.admin_key, name, config=override)
        self.current = config
        took = time.perf_counter() - started
        log.info("loaded %s in %.1f s", loaded, took)
        return took

    def _overrides(self, config: BatcherConfig) -> tuple[str, dict[str, dict]]:
        override = json.loads(config_json(candidate_spec(self.base, config, self.keep_queue)))
        return config.label, {self.base.name: override}

    def prepare(self, config: BatcherConfig) -> None:
        """Load ``config``, then wait (at most ``RETIRE_WAIT_S``) for the replaced instances' stubs to exit:
        ``load_model`` returns while they still run, which a run would share the cores with."""
        if not self.load(config):
            return
        deadline = time.perf_counter() + RETIRE_WAIT_S
        while self.live_stubs() > config.instances and time.perf_counter() < deadline:
            time.sleep(0.05)

    def live_stubs(self) -> int:
        """The loaded model's live Python-backend stubs (0 for other backends)."""
        assert self.server is not None
        if self.server.pid is None:
            return 0
        name = self.base.name
        return sum(
            1 for s in server_stubs(self.server.pid) if s.alive and s.model == name and s.instance != name
        )

    def measure(
        self,
        load: Load,
        label: str,
        settings: MeasureSettings | None = None,
        engine: LoadEngine | None = None,
    ) -> Measurement:
        """``load`` on the configuration loaded now, through the noise policy."""
        with self.watching(label):
            return self.noise.measure(
                lambda: self._measure_once(load, label, settings or self.settings, engine)
            )

    def _measure_once(
        self, load: Load, label: str, settings: MeasureSettings, engine: LoadEngine | None = None
    ) -> Measurement:
        sized = self.sized(settings)
        if sized is not settings:
            log.info("%s: windows of %.1f s (%d batches of %.0f ms)", label, sized.window_s,
                     sized.window_batches, 1e3 * self.largest_batch_s)  # fmt: skip
        run = measure(self.target, load, sized, self.server, label, self.related, engine or self.engine)
        self.runs.append(run)
        return run


@contextlib.contextmanager
def keep_dead_server_log(folder: Path) -> Iterator[None]:
    """Where the server died, its log copied into ``folder`` (the next server would overwrite it)."""
    try:
        yield
    except ServerDiedError as error:
        source = Path(error.log_path)
        kept = folder / "server.log"
        if not error.kept and source.is_file() and source.resolve() != kept.resolve():
            shutil.copyfile(source, kept)
            error.kept = str(kept)
            error.args = (f"{error.args[0]}; its log is kept in {kept}",)
        raise


def stage_configs(built: BuiltPipeline, config: BatcherConfig) -> list[ModelConfig]:
    """Every stage's model config with the candidate's batching."""
    pipeline = built.spec
    if config.batching:
        delay, preferred = config.max_queue_delay_us, config.preferred_batch_sizes
        batching = Batching(mode="dynamic", max_queue_delay_us=delay, preferred_batch_sizes=preferred)
        pipeline = dataclasses.replace(pipeline, batching=batching)
    stages = built.configs[1:]  # the ensemble first, then the stages in order
    return [
        dataclasses.replace(
            stage,
            dynamic_batching=dynamic_batching(stage_batching(pipeline, k)) if config.batching else None,
            model_warmup=[],
        )
        for k, stage in enumerate(stages)
    ]


class PipelineSession(ModelSession):
    """``base`` is the model the pipeline splits (its inputs and batch limit)."""

    def __init__(
        self, spec: Spec, pipeline: str, largest_batch: int, workdir: Path, engine: LoadEngine,
        settings: MeasureSettings = TUNE_WINDOWS, noise: NoisePolicy | None = None,
    ) -> None:  # fmt: skip
        self.pipeline: PipelineSpec = spec.pipeline(pipeline)
        super().__init__(spec, self.pipeline.model, largest_batch, workdir, engine, settings, noise)
        # The stages' batch axis is the model's: candidates stay within what the stages were built for.
        self.largest_batch = self.base.max_batch_size
        self.related = tuple(self.pipeline.stage_names)
        self.sent_to = self.pipeline.name
        self.built: BuiltPipeline | None = None

    def __enter__(self) -> PipelineSession:
        repository = self.workdir / "repository"
        # built with the probe's first candidate loaded: one reload of every stage fewer
        batching = Batching(mode="dynamic", max_queue_delay_us=0)
        self.pipeline = dataclasses.replace(self.pipeline, batching=batching)
        spec = Spec(models=(dataclasses.replace(self.base, warmup=False),), pipelines=(self.pipeline,))
        build_repository(spec, repository, num_gpus=0)  # the monolithic model: the raw reference
        (self.built,) = build_pipelines(spec, repository, num_gpus=0)
        # the ensemble loads its stages
        self.server = TritonServer(self._options(repository, [self.pipeline.name])).start()
        self.current = BatcherConfig(self.largest_batch, 0)
        return self

    def _overrides(self, config: BatcherConfig) -> tuple[str, dict[str, dict]]:
        assert self.built is not None
        if config.instances != 1:
            raise ValueError("a pipeline's candidates keep the stages' instance counts (instances = 1)")
        overrides = {
            stage.name: json_format.MessageToDict(stage.to_proto())
            for stage in stage_configs(self.built, config)
        }
        return f"{config.label} on the stages of {self.pipeline.name}", overrides

    def _measure_once(
        self, load: Load, label: str, settings: MeasureSettings, engine: LoadEngine | None = None
    ) -> Measurement:
        run = super()._measure_once(load, label, settings, engine)
        if run.server is not None:
            # the first stage's view, where the delay acts: later stages overlap it (pipeline parallel), so
            # summing their compute would count overlapped time as serial; a failure at any stage counts
            stages = [run.server.related[name] for name in self.related]
            stats = dataclasses.replace(stages[0], failed=max(s.failed for s in stages))
            run.server = dataclasses.replace(run.server, stats=stats)
        return run
