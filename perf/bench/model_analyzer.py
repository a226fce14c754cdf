"""Model Analyzer's brute search on one model of the spec, as Triton users run it, and its pick.

``prepare`` builds the model into a repository every variant of the search loads from: the spec's
configuration without its queue policy (on Triton 2.51 a ``default_queue_policy`` stalls the dynamic
batcher ~510 ms, as ``perf.spec_overlay`` explains), at the largest ``max_batch_size`` searched, and
the input rows perf_analyzer sends (``--input-data``: ids inside the embedding tables; its random
data would fall outside them). ``analyzer_config`` writes Model Analyzer's YAML for the same budget
and search space as the tuner's grid: local launch mode with the server the project uses
(``server.install``: the embedded tritonserver, the assembled backend folder with our python-based
onnxruntime backend, the venv on ``PYTHONPATH``), CPU instances, perf_analyzer 2.41 from
``.venv/perf_analyzer``, objective throughput, constraint p99 ≤ budget. ``run`` starts it (its own
venv, ``perf.model_analyzer_install``) and times it; ``read_pick`` reads its pick from the CSV it
exports, the way its summary picks: the most throughput among the measurements within the budget.

What the search cannot vary by design: Model Analyzer's automatic brute search sets
``dynamic_batching {}`` (no delay) on every variant; only the base configuration (``…_config_default``)
keeps the spec's delay. Its ``triton_server_flags`` is a mapping, so one ``--backend-config`` only:
the shared-memory prefix, so that its servers never share regions with another server on the host.
"""

from __future__ import annotations

import csv
import dataclasses
import logging
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from exporters.repository import build_repository
from exporters.schema.models import ModelSpec, Spec
from perf.errors import OptionError, StudyError
from perf.measure.analyzer import find_perf_analyzer, unavailable_message, write_input_data
from perf.measure.target import target_from_spec
from perf.model.batcher import BatcherConfig
from server import ports
from server.install import assemble_backends, find_install
from server.launcher import free_port, server_environment

log = logging.getLogger(__name__)
INPUT_ROWS = 64  # rows of valid input perf_analyzer cycles through
OUTPUT_FIELDS = (
    "model_name",
    "batch_size",
    "concurrency",
    "model_config_path",
    "instance_group",
    "max_batch_size",
    "satisfies_constraints",
    "perf_throughput",
    "perf_latency_p99",
)
CSV_NAME = "metrics-model-inference.csv"


@dataclass(frozen=True)
class SearchSpace:
    """What Model Analyzer's brute search varies: instance counts and ``max_batch_size`` (powers of two
    from 1), with concurrencies doubling from 1 up to ``max_concurrency``. ``smoke``: no search, the
    base configuration alone at ``smoke_concurrency`` (a test of the whole path in about a minute)."""

    max_instances: int
    max_batch_size: int
    max_concurrency: int = 1024
    smoke: bool = False
    smoke_concurrency: int = 4


@dataclass(frozen=True)
class Paths:
    """Where one Model Analyzer run keeps its files, all under ``root``."""

    root: Path

    @property
    def repository(self) -> Path:
        return self.root / "repository"

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def inputs(self) -> Path:
        return self.root / "inputs.json"

    @property
    def variants(self) -> Path:
        return self.root / "output_repository"

    @property
    def export(self) -> Path:
        return self.root / "export"

    @property
    def log(self) -> Path:
        return self.root / "model-analyzer.log"

    @property
    def server_log(self) -> Path:
        return self.root / "tritonserver.log"

    @property
    def backends(self) -> Path:
        return self.root / "backends"


@dataclass(frozen=True)
class Measured:
    """One row of Model Analyzer's inference CSV: a variant at one concurrency, as it measured it."""

    variant: str
    concurrency: int
    instances: int
    max_batch_size: int
    within_budget: bool
    throughput: float
    p99_ms: float


@dataclass(frozen=True)
class Search:
    """What one Model Analyzer run did and picked."""

    pick: BatcherConfig | None
    pick_variant: str | None
    pick_row: Measured | None
    rows: list[Measured]
    seconds: float
    config: Path

    profiled: list[tuple[str, int]]  # every perf_analyzer run it made: (variant, concurrency)

    @property
    def variants(self) -> list[str]:
        return list(dict.fromkeys(variant for variant, _ in self.profiled))


PROFILED = re.compile(r"Profiling (\S+): concurrency=(\d+)")


def profiled(log_text: str) -> list[tuple[str, int]]:
    """The perf_analyzer runs Model Analyzer's log announces ("Profiling <variant>: concurrency=N")."""
    return [(m.group(1), int(m.group(2))) for m in PROFILED.finditer(log_text)]


def base_config(spec: ModelSpec) -> BatcherConfig:
    """The spec's own batching and CPU instance count, as the tuner's candidates say it."""
    batching = spec.batching
    if batching.mode != "dynamic":
        return BatcherConfig(1, instances=spec.instances.cpu)
    return BatcherConfig(
        spec.max_batch_size, batching.max_queue_delay_us, batching.preferred_batch_sizes, spec.instances.cpu
    )


def prepare(spec: ModelSpec, space: SearchSpace, paths: Paths) -> None:
    """The repository Model Analyzer varies (the spec's model, no queue policy, built at the largest
    batch searched) and the input rows perf_analyzer sends."""
    batching = dataclasses.replace(spec.batching, queue=None)
    largest = max(space.max_batch_size, spec.max_batch_size)
    built = dataclasses.replace(spec, max_batch_size=largest, batching=batching)
    build_repository(Spec(models=(built,)), paths.repository, num_gpus=0, only=[spec.name])
    target = target_from_spec(spec, "unused", rows=INPUT_ROWS)
    write_input_data(target.inputs, paths.inputs, INPUT_ROWS)


def analyzer_config(spec: ModelSpec, budget_ms: float, space: SearchSpace, paths: Paths) -> dict:
    """Model Analyzer's profile configuration (its YAML schema) for ``spec`` and the budget."""
    analyzer = find_perf_analyzer()
    if analyzer is None:
        raise OptionError(f"Model Analyzer measures with perf_analyzer: {unavailable_message()}")
    install = find_install()
    host = "127.0.0.1"
    model: dict = {
        "cpu_only": True,
        "perf_analyzer_flags": {"input-data": str(paths.inputs.resolve())},
        "constraints": {"perf_latency_p99": {"max": budget_ms}},
        "objectives": {"perf_throughput": 10},
    }
    search: dict = {
        "run_config_search_mode": "brute",
        "run_config_search_max_instance_count": space.max_instances,
        "run_config_search_min_model_batch_size": 1,
        "run_config_search_max_model_batch_size": space.max_batch_size,
        "run_config_search_max_concurrency": space.max_concurrency,
    }
    if space.smoke:
        search = {"run_config_search_disable": True}
        model["parameters"] = {"concurrency": [space.smoke_concurrency], "batch_sizes": [1]}
    prefix = f"ma{os.getpid()}_"
    # Its server takes ports from the port base like ours (``server.ports``); held for this process.
    base = ports.reserve()
    return {
        "model_repository": str(paths.repository.resolve()),
        "output_model_repository_path": str(paths.variants.resolve()),
        "override_output_model_repository": True,
        "checkpoint_directory": str((paths.root / "checkpoints").resolve()),
        "export_path": str(paths.export.resolve()),
        "profile_models": {spec.name: model},
        **search,
        "triton_launch_mode": "local",
        "triton_server_path": str(install.binary),
        "triton_output_path": str(paths.server_log.resolve()),
        "triton_server_environment": server_environment(install),
        "triton_server_flags": {
            "backend-directory": str(assemble_backends(install, paths.backends).resolve()),
            "backend-config": f"python,shm-region-prefix-name={prefix}",
        },
        "triton_http_endpoint": f"{host}:{base.http if base else free_port(host)}",
        "triton_grpc_endpoint": f"{host}:{base.grpc if base else free_port(host)}",
        "triton_metrics_url": f"http://{host}:{base.metrics if base else free_port(host)}/metrics",
        "client_protocol": "grpc",
        "perf_analyzer_path": str(analyzer),
        "inference_output_fields": list(OUTPUT_FIELDS),
    }


def write_config(spec: ModelSpec, budget_ms: float, space: SearchSpace, paths: Paths) -> Path:
    """``prepare`` the repository and write ``config.yaml``; returns its path."""
    paths.root.mkdir(parents=True, exist_ok=True)
    prepare(spec, space, paths)
    config = analyzer_config(spec, budget_ms, space, paths)
    paths.config.write_text(yaml.safe_dump(config, sort_keys=False))
    return paths.config


def run(program: Path, paths: Paths, timeout_s: float) -> float:
    """``model-analyzer profile -f config.yaml``; its output goes to ``model-analyzer.log``. Returns
    the seconds it took; a failure or time-out raises StudyError with the end of its log."""
    started = time.perf_counter()
    command = [str(program), "profile", "-f", str(paths.config)]
    log.info("running %s", " ".join(command))
    with open(paths.log, "w") as sink:
        try:
            done = subprocess.run(command, stdout=sink, stderr=subprocess.STDOUT, timeout=timeout_s)
            returncode = done.returncode
        except subprocess.TimeoutExpired:
            returncode = None
    seconds = time.perf_counter() - started
    if returncode != 0:
        tail = paths.log.read_text()[-1500:].strip()
        what = f"did not finish in {timeout_s:.0f} s" if returncode is None else f"exited {returncode}"
        raise StudyError(f"Model Analyzer {what} ({paths.log}):\n{tail}")
    return seconds


def _instances(text: str) -> int:
    """``instance_group`` as its CSV writes it, e.g. ``2:CPU`` or ``1:CPU + 1:GPU``: the total count."""
    counts = [int(n) for n in re.findall(r"(\d+):", text)]
    if not counts:
        raise StudyError(f"Model Analyzer's CSV: cannot read instance_group {text!r}")
    return sum(counts)


def read_rows(path: Path) -> list[Measured]:
    """Every measurement of Model Analyzer's inference CSV (columns named as ``OUTPUT_FIELDS`` asks)."""
    if not path.is_file():
        raise StudyError(f"Model Analyzer wrote no {path.name} in {path.parent}")
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    try:
        measured = [
            Measured(
                row["Model Config Path"],
                int(row["Concurrency"]),
                _instances(row["Instance Group"]),
                int(row["Max Batch Size"]),
                row["Satisfies Constraints"].strip().lower() == "yes",
                float(row["Throughput (infer/sec)"]),
                float(row["p99 Latency (ms)"]),
            )
            for row in rows
        ]
    except KeyError as error:
        raise StudyError(f"{path}: no column {error} (columns: {list(rows[0]) if rows else []})") from error
    return list(dict.fromkeys(measured))  # its table repeats a measurement where the search revisited it


def variant_config(variants: Path, name: str) -> BatcherConfig:
    """A variant Model Analyzer wrote, read back as the tuner's candidate."""
    path = variants / name / "config.pbtxt"
    if not path.is_file():
        raise StudyError(f"Model Analyzer's pick {name}: no {path}")
    config = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
    instances = sum(group.count or 1 for group in config.instance_group) or 1
    if not config.HasField("dynamic_batching") or config.max_batch_size <= 1:
        return BatcherConfig(1, instances=instances)
    batching = config.dynamic_batching
    preferred = tuple(s for s in batching.preferred_batch_size if s <= config.max_batch_size)
    return BatcherConfig(config.max_batch_size, batching.max_queue_delay_microseconds, preferred, instances)


def pick(rows: list[Measured]) -> Measured | None:
    """Model Analyzer's pick: the most throughput among the measurements within the budget."""
    within = [row for row in rows if row.within_budget]
    return max(within, key=lambda row: row.throughput) if within else None


def search(
    program: Path, spec: ModelSpec, budget_ms: float, space: SearchSpace, root: Path, timeout_s: float
) -> Search:
    """Write the configuration, run the search, read its pick."""
    paths = Paths(root)
    write_config(spec, budget_ms, space, paths)
    seconds = run(program, paths, timeout_s)
    rows = read_rows(paths.export / "results" / CSV_NAME)
    best = pick(rows)
    chosen = variant_config(paths.variants, best.variant) if best else None
    runs = profiled(paths.log.read_text())
    return Search(chosen, best.variant if best else None, best, rows, seconds, paths.config, runs)
