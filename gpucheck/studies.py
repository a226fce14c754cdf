"""The studies through the real server, each returning JSON-ready figures, and the one server they share:
every model loaded at the start and no watchdog (a stub that dies is a finding; a model that fails to
load fails only the studies that need it). Throughput points are one window of a closed loop, not a
search for stability: the lent minutes are few, and the report compares points of one run."""

from __future__ import annotations

import dataclasses
import logging
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as system_shm

from client import shm
from client.infer import make_inputs, timed_calls
from client.stats import model_stats
from exporters.artifacts.parity import check_outputs
from exporters.sources.inputs import draw_inputs
from exporters.sources.load import build_torch_model
from gpucheck import machine
from gpucheck.grid import Grid
from gpucheck.raw import RawCurve
from gpucheck.repository import BATCHING_MODEL, INSTANCE_MODEL, CheckRepository
from perf.measure.engine import MeasureSettings
from perf.measure.loads import closed_loop
from perf.measure.measurement import measure
from perf.measure.target import target_from_spec
from perf.model.latency import fit_latency
from perf.model.memory import context_bytes
from perf.plan.graph_memory import GraphMemoryError, graph_memory
from server import ServerOptions, TritonServer
from server.stubs import server_stubs

log = logging.getLogger(__name__)
MIB = 1 << 20
PARITY_ROWS = 8
SEED = 21
POINT_FIGURES = ("throughput", "p50_ms", "p99_ms", "failed", "requests")
CUDA_POOL_BYTES = 1 << 30  # per GPU: batches of 256 images are 12 MiB each way, many in flight


class ServingError(RuntimeError):
    """A model would not load, unload or answer; the message names it."""


class Session:
    """The check's tritonserver: ``start()`` loads every model, ``close()`` stops it."""

    def __init__(self, repository: Path, on_gpu: bool, workdir: Path) -> None:
        extra = [f"--cuda-memory-pool-byte-size=0:{CUDA_POOL_BYTES}"] if on_gpu else []
        options = ServerOptions(
            repository=repository, self_heal=False, startup_timeout_s=600.0, workdir=workdir, extra_args=extra
        )
        self.server = TritonServer(options)

    def start(self) -> dict[str, Any]:
        self.server.start()  # a model that fails to load fails the studies that need it (``require``)
        self.grpc = grpcclient.InferenceServerClient(self.server.grpc_url)
        return {"install": str(self.server.install.binary), "failed_models": dict(self.server.failed_models)}

    def close(self) -> None:
        self.grpc.close()  # an open connection would hold tritonserver's exit
        # drained first, as `make serve`'s stop: on SIGTERM alone Triton 2.51 may leave torch-stage models
        # unloading until its exit timeout expires, time the lent machine's budget counts
        self.server.stop()

    def require(self, names: Sequence[str]) -> None:
        """``ServingError`` naming each of ``names`` that failed to load, with its log lines."""
        failed = [name for name in names if name in self.server.failed_models]
        if failed:
            raise ServingError(
                "; ".join(f"{n} did not load: {self.server.failed_models[n]}" for n in failed)
                + "\n"
                + "\n".join(line for n in failed for line in self.server.model_log_lines(n))
            )

    def stub_pids(self, model: str) -> list[int]:
        """The live stubs serving ``model``: memory is read per stub, so models beside it do not blur it."""
        assert self.server.pid is not None
        return [s.pid for s in server_stubs(self.server.pid) if s.alive and s.model == model]

    def timed(self, model: str, arrays: dict[str, np.ndarray], count: int, warmup: int = 2) -> list[float]:
        """Client milliseconds of ``count`` requests, one in flight, after ``warmup``."""
        inputs = make_inputs(grpcclient, arrays)
        return timed_calls(lambda: self.grpc.infer(model, inputs), count, warmup)


@dataclass
class Context:
    grid: Grid
    repository: CheckRepository
    session: Session
    raw: dict[tuple[str, str], RawCurve]  # (base, precision) -> curve
    device: str  # torch's name of the GPU, or "cpu"

    @property
    def on_gpu(self) -> bool:
        return self.repository.device == "gpu"


def _fit(points: dict[int, float]) -> dict[str, float]:
    fit = fit_latency(points)
    return {"T_ms": fit.t_ms, "dt_ms": fit.dt_ms, "r2": fit.r2}


def _named_inputs(spec: Any, rows: int, seed: int) -> dict[str, np.ndarray]:
    return dict(zip([t.name for t in spec.inputs], draw_inputs(spec, rows, seed), strict=True))


def latency_group(grid: Grid) -> list[str]:
    """The latency models' names, as ``perf.plan.profile.precision_variant`` names a variant."""
    return [base if precision == "fp32" else f"{base}_{precision}" for base, precision in grid.latency_models]


def latency(context: Context) -> dict[str, Any]:
    """``T + (N−1)·Δt`` served, one request at a time per batch, beside the server's compute and raw torch."""
    session, grid = context.session, context.grid
    models = {}
    for name in latency_group(context.grid):
        built = context.repository.models[name]
        spec = built.model.spec
        raw = context.raw.get((built.model.base, built.model.precision))
        points = {}
        for batch in grid.batches:
            arrays = _named_inputs(spec, batch, SEED)
            before = model_stats(session.grpc, "grpc", name)
            times = session.timed(name, arrays, grid.requests_per_batch)
            compute = (model_stats(session.grpc, "grpc", name) - before).compute_ms_at(batch)
            points[batch] = {
                "client_ms": statistics.median(times),
                "client_p90_ms": float(np.percentile(times, 90)),
                "compute_ms": compute,
                "raw_ms": raw.batch_ms.get(batch) if raw else None,
            }
        models[name] = {
            "base": built.model.base,
            "precision": built.model.precision,
            "batches": points,
            "fit_client": _fit({b: p["client_ms"] for b, p in points.items()}),
            "fit_compute": _fit({b: p["compute_ms"] for b, p in points.items() if p["compute_ms"] > 0}),
            "fit_raw": _fit(raw.batch_ms) if raw else None,
        }
    return {"models": models}


def parity(context: Context) -> dict[str, Any]:
    """Served outputs against the eager fp32 model on the CPU, held to the precision's tolerance."""
    results = {}
    for name in latency_group(context.grid):
        built = context.repository.models[name]
        spec = built.model.spec
        reference = build_torch_model(spec).eval()
        named = _named_inputs(spec, min(PARITY_ROWS, spec.max_batch_size), SEED + 1)
        output = spec.outputs[0].name
        served = context.session.grpc.infer(name, make_inputs(grpcclient, named)).as_numpy(output)
        with torch.inference_mode():
            expected = reference(*(torch.from_numpy(a).float() if a.dtype.kind == "f" else torch.from_numpy(a)
                                   for a in named.values())).numpy()  # fmt: skip
        check = check_outputs(
            expected, served.astype(np.float32), spec.outputs[0].tolerance, built.model.precision
        )
        errors = {"max_rel_error": check.max_rel_error, "max_abs_error": check.max_abs_error}
        limit = {"limit": check.tolerance.max_rel, "ok": check.ok, "problems": list(check.problems)}
        results[name] = {"precision": built.model.precision, **errors, **limit}
    return {"models": results}


def _stub_memory(context: Context, model: str) -> list[float] | None:
    listed = machine.process_memory_mib() if context.on_gpu else None
    if listed is None:
        return None
    return [listed[pid] for pid in context.session.stub_pids(model) if pid in listed]


def memory(context: Context) -> dict[str, Any]:
    """Each latency model's stub memory after the largest batch, against torch's and ``make plan``'s."""
    context_mib = context_bytes(context.device) / MIB if context.on_gpu else None
    models = {}
    for name in latency_group(context.grid):
        built = context.repository.models[name]
        raw = context.raw.get((built.model.base, built.model.precision))
        try:
            predicted = graph_memory(built.model.spec).instance_bytes(built.model.precision) / MIB
        except GraphMemoryError as error:
            log.warning("no memory prediction for %s: %s", name, error)
            predicted = None
        models[name] = {
            "precision": built.model.precision,
            "stub_mib": _stub_memory(context, name),
            "raw_weights_mib": raw.weights_mib if raw else None,
            "raw_peak_mib": raw.peak_mib if raw else None,
            "predicted_instance_mib": predicted,
            "predicted_context_mib": context_mib,
        }
    return {"models": models, "gpu_used_mib": machine.gpu_used_mib(), "batch": context.grid.max_batch}


def _point(context: Context, spec: Any, concurrency: int, label: str) -> dict[str, Any]:
    target = target_from_spec(spec, context.session.server.grpc_url, rows=max(concurrency, 1), seed=SEED)
    windows = {"warmup_s": context.grid.warmup_s, "window_s": context.grid.window_s}
    settings = MeasureSettings(**windows, stable_windows=1, max_windows=1)
    measurement = measure(target, closed_loop(concurrency), settings, context.session.server, label)
    figures = {key: getattr(measurement.figures, key) for key in POINT_FIGURES}
    return {"concurrency": concurrency, **figures, "mean_batch": measurement.stats.mean_batch}


def batching(context: Context) -> dict[str, Any]:
    """The recommender with dynamic batching against none, batch-1 requests at each concurrency."""
    none_spec = context.repository.models[BATCHING_MODEL].model.spec
    dynamic = context.repository.models[f"{BATCHING_MODEL}_dynamic"].model.spec
    points = []
    for concurrency in context.grid.concurrencies:
        off = _point(context, none_spec, concurrency, f"none c{concurrency}")
        on = _point(context, dynamic, concurrency, f"dynamic c{concurrency}")
        ratio = on["throughput"] / off["throughput"] if off["throughput"] else None
        points.append({"concurrency": concurrency, "none": off, "dynamic": on, "throughput_ratio": ratio})
    return {"model": BATCHING_MODEL, "queue_delay_us": dynamic.batching.max_queue_delay_us, "points": points}


def instance_names(grid: Grid) -> list[str]:
    return [INSTANCE_MODEL if n == 1 else f"{INSTANCE_MODEL}_x{n}" for n in grid.instances]


def instances(context: Context) -> dict[str, Any]:
    """N instances of the image classifier on GPU 0 (no batcher) at one concurrency, and what each holds."""
    rows = []
    for count, name in zip(context.grid.instances, instance_names(context.grid), strict=True):
        spec = context.repository.models[name].model.spec
        point = _point(context, spec, context.grid.instance_concurrency, name)
        rows.append({"instances": count, **point, "stub_mib": _stub_memory(context, name)})
    base = rows[0]["throughput"] or None
    for row in rows:
        row["throughput_ratio"] = row["throughput"] / base if base else None
    return {"model": INSTANCE_MODEL, "concurrency": context.grid.instance_concurrency, "rows": rows}


def pipeline(context: Context) -> dict[str, Any]:
    """The two-stage image classifier against the monolith: latency, throughput, bytes crossing stages."""
    monolith = context.repository.models[INSTANCE_MODEL].model.spec
    rows = []
    for name in (INSTANCE_MODEL, *context.grid.pipelines):
        spec = dataclasses.replace(monolith, name=name)
        built = context.repository.pipelines[name] if name in context.grid.pipelines else None  # monolith
        boundary = built.record.boundaries if built else ()
        sent = sum(b.bytes_per_row for b in boundary)  # bytes one request row moves across the stages
        latencies = {}
        for batch in context.grid.pipeline_batches:
            arrays = _named_inputs(spec, batch, SEED)
            times = context.session.timed(name, arrays, context.grid.requests_per_batch)
            latencies[batch] = {"client_ms": statistics.median(times), "boundary_bytes": sent * batch}
        point = _point(context, spec, context.grid.pipeline_concurrency, name)
        rows.append({
            "model": name,
            "boundary": [{"tensor": b.tensor, "dtype": b.dtype, "shape": list(b.shape)} for b in boundary],
            "boundary_bytes_per_row": sent,
            "boundary_fp32_bytes_per_row": sum(b.fp32_bytes_per_row for b in boundary),
            "batches": latencies,
            "throughput": point,
        })  # fmt: skip
    return {"rows": rows}


def _transport_times(
    context: Context, model: str, array: np.ndarray, transport: str
) -> tuple[list[float], bool]:
    """Times of requests of ``array`` through ``transport``, and whether the last answer was doubled."""
    client, count = context.session.grpc, context.grid.shm_requests
    size = array.nbytes
    tensor = grpcclient.InferInput("x", list(array.shape), "FP32")
    output = grpcclient.InferRequestedOutput("y")

    def run() -> list[float]:
        return timed_calls(lambda: client.infer(model, [tensor], outputs=[output]), count, warmup=3)

    if transport == "grpc":
        tensor.set_data_from_numpy(array)
        times = run()
        answer = client.infer(model, [tensor], outputs=[output]).as_numpy("y")
        return times, bool(np.array_equal(answer, array * 2))
    if transport == "cuda":
        import tritonclient.utils.cuda_shared_memory as cudashm

        memory, region_of = cudashm, shm.cuda_region
    else:
        memory, region_of = system_shm, shm.system_region
    with region_of(client, 2 * size) as (region, handle):
        memory.set_shared_memory_region(handle, [array])
        tensor.set_shared_memory(region, size, 0)
        output.set_shared_memory(region, size, size)
        times = run()
        answer = memory.get_contents_as_numpy(handle, np.float32, array.shape, offset=size).copy()
    return times, bool(np.array_equal(answer, array * 2))


def shared_memory(context: Context) -> dict[str, Any]:
    """One input of ``shm_mib`` MiB (and as large an output) through each transport, one request at a time."""
    spec = next(m.model.spec for m in context.repository.models.values() if m.model.base == "trivial")
    array = np.ascontiguousarray(draw_inputs(spec, 1, SEED)[0], dtype=np.float32)
    transports = ["grpc", "system"] + (["cuda"] if context.on_gpu else [])
    rows, not_measured = [], []
    for transport in transports:
        times, correct = _transport_times(context, spec.name, array, transport)
        median = statistics.median(times)
        rows.append({
            "transport": transport, "median_ms": median, "p90_ms": float(np.percentile(times, 90)),
            "requests": len(times), "correct": correct, "mib_per_s": 2 * array.nbytes / MIB / (median / 1e3),
        })  # fmt: skip
    if not context.on_gpu:
        not_measured.append("cuda: no CUDA device here (the rehearsal); measured on the GPU machine")
    return {"model": spec.name, "input_bytes": array.nbytes, "rows": rows, "not_measured": not_measured}
