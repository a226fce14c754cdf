"""The check's output: ``gpu-figures.json`` holds every figure (and the compute profile); the report and
plots are rendered from it alone."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gpucheck.grid import Grid
from gpucheck.machine import MachineFacts
from gpucheck.raw import RawCurve
from perf.markdown import number, plain, ratio, table, write_report
from perf.studies.plots import plt, save_figure

REPORT = "gpu-report.md"
FIGURES = "gpu-figures.json"
PLOTS = ("gpu-latency.png", "gpu-throughput.png", "gpu-transfer.png")
COMMAND = "bash scripts/gpu_check.sh  (make gpu-check; docs/GPU.md)"
# What the lent machine cannot run, with the reason, in every report (docs/GPU.md).
NOT_MEASURED = (
    ("TensorRT FP16 plans (the configs' `gpu_execution_accelerator: tensorrt`)",
     "TensorRT is not on the lent machine and its wheels are hundreds of MB, over the 64 MiB a command "
     "carries; the plans are configured and tested as text only"),
    ("onnxruntime's CUDA execution provider",
     "the machine's onnxruntime is the CPU build and onnxruntime-gpu's wheel is over the travel budget; the "
     "GPU path measured here is torch on CUDA through the Python backend (python_backend/torch_stage)"),
    ("the NGC container (native onnxruntime and TensorRT backends)",
     "no Docker and no registry on the lent machine: only the PyPI wheel's tritonserver 2.51 with the Python "
     "backend runs there"),
    ("several GPUs (data or pipeline parallel across cards, NVLink vs PCIe)",
     "one GPU is lent: every instance and stage here is on GPU 0"),
)  # fmt: skip


def compute_profile(device: str, curves: Iterable[RawCurve]) -> dict[str, Any]:
    """What ``make plan --compute-profile`` reads: raw torch's times per batch and their fit."""
    models: dict[str, dict[str, Any]] = {}
    for curve in curves:
        models.setdefault(curve.base, {})[curve.precision] = {
            "T_ms": curve.fit.t_ms,
            "dt_ms": curve.fit.dt_ms,
            "batches": {str(b): ms for b, ms in sorted(curve.batch_ms.items())},
        }
    source = "raw torch on the device, make gpu-check (gpucheck.raw)"
    return {"device": device, "source": source, "models": models}


def figures(
    grid: Grid, facts: MachineFacts, sections: dict[str, dict], raw: dict, wall_s: float
) -> dict[str, Any]:
    """Every figure of the run as one JSON-ready document, the report's only source."""
    not_measured = [{"what": what, "why": why} for what, why in NOT_MEASURED]
    if not facts.cuda_available:
        not_measured.append({
            "what": "GPU memory per instance and CUDA shared memory",
            "why": "no CUDA device on this machine (a rehearsal): measured on the GPU machine",
        })  # fmt: skip
    return {
        "check": {"grid": dataclasses.asdict(grid), "wall_s": wall_s, "command": COMMAND},
        "machine": dataclasses.asdict(facts),
        "compute_profile": compute_profile(facts.device, raw.values()),
        "sections": sections,
        "not_measured": not_measured,
    }


def _ok(sections: dict, name: str) -> dict | None:
    section = sections.get(name, {})
    return section if section.get("status") == "ok" else None


def _status_lines(sections: dict) -> list[str]:
    rows = []
    for name, section in sections.items():
        detail = (section.get("error") or section.get("reason") or "")[:300].replace("|", "/")
        rows.append([name, section["status"], number(section.get("seconds", math.nan)), detail])
    return [table(["step", "status", "s", "detail"], rows)]


def _ms(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else number(value, digits)


def _fit_rows(model: dict) -> list[list[str]]:
    keys = {"client": "fit_client", "server compute": "fit_compute", "raw torch": "fit_raw"}
    fits = {what: model[key] for what, key in keys.items()}
    return [[what, _ms(f["T_ms"]), _ms(f["dt_ms"], 4), _ms(f["r2"])] for what, f in fits.items() if f]


def _latency_lines(section: dict) -> list[str]:
    lines = [
        "Each batch size is one request at a time over gRPC (client time, median), beside the server's own "
        "compute for that batch (`/v2/models/<m>/stats`) and raw torch on the same device (inputs already "
        "there). The fit is `T_batch(N) = T + (N−1)·Δt` by least squares.",
        "",
    ]
    for name, model in section["models"].items():
        rows = [
            [b, _ms(p["client_ms"]), _ms(p["client_p90_ms"]), _ms(p["compute_ms"]), _ms(p["raw_ms"])]
            for b, p in model["batches"].items()
        ]
        lines += [f"**{name}** ({model['precision']})", ""]
        lines += [table(["batch", "client ms", "p90 ms", "compute ms", "raw ms"], rows), ""]
        lines += [table(["fit of", "T ms", "Δt ms", "R²"], _fit_rows(model)), ""]
    return lines


def _parity_lines(section: dict) -> list[str]:
    rows = []
    for name, m in section["models"].items():
        within = "yes" if m["ok"] else "NO: " + "; ".join(m["problems"])
        rows.append([name, m["precision"], f"{m['max_rel_error']:.3g}", f"{m['limit']:g}", within])
    return [
        "Served outputs (8 rows) against the eager fp32 model on the CPU, held to the precision's "
        "tolerance (`exporters.artifacts.parity`).",
        "",
        table(["model", "precision", "max rel error", "limit", "within"], rows),
    ]


def _yes(right: bool) -> str:
    return "yes" if right else "NO"


def _mib(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, list):
        return ", ".join(number(v) for v in value) or "–"
    return number(value)


MEMORY_HEADER = ("model", "stub MiB (nvidia-smi)", "torch weights MiB", "torch peak MiB", "planned MiB",
                 "planned + context MiB")  # fmt: skip


def _memory_lines(section: dict) -> list[str]:
    rows = []
    for name, m in section["models"].items():
        planned, context = m["predicted_instance_mib"], m["predicted_context_mib"]
        with_context = planned + context if planned is not None and context else None
        measured = [_mib(m[k]) for k in ("stub_mib", "raw_weights_mib", "raw_peak_mib")]
        rows.append([name, *measured, _mib(planned), _mib(with_context)])
    return [
        f"After a request of batch {section['batch']}: what nvidia-smi says each instance's stub process "
        "holds (its CUDA context, torch's cache and workspaces), torch's allocator in the check's own "
        "process for the same module (weights; peak of one forward at that batch), and what `make plan` "
        "counts per instance (`perf.plan.graph_memory`) and with the CUDA context it assumes for this GPU "
        "(`perf.model.memory`; the planner counts it once per GPU, while each Python-backend instance is a "
        f"process of its own). GPU memory used in all, every model of the check loaded: "
        f"{_mib(section.get('gpu_used_mib'))} MiB.",
        "",
        table(MEMORY_HEADER, rows),
    ]


def _point_cells(point: dict) -> list[str]:
    digits = {"throughput": 1, "p50_ms": 2, "p99_ms": 2, "mean_batch": 1}
    return [number(point[key], places) for key, places in digits.items()]


BATCHING_HEADER = ("concurrency", "none inf/s", "p50 ms", "p99 ms", "batch", "dynamic inf/s", "p50 ms",
                   "p99 ms", "batch", "dynamic / none")  # fmt: skip


def _batching_lines(section: dict) -> list[str]:
    rows = []
    for p in section["points"]:
        gain = ratio(p["throughput_ratio"] or math.nan)
        rows.append([p["concurrency"], *_point_cells(p["none"]), *_point_cells(p["dynamic"]), gain])
    return [
        f"`{section['model']}`, batch-1 requests in a closed loop (one window each): no batching against "
        f"dynamic batching (queue delay {section['queue_delay_us']} µs). Mean batch is what the server "
        "formed.",
        "",
        table(BATCHING_HEADER, rows),
    ]


def _instance_lines(section: dict) -> list[str]:
    rows = [
        [r["instances"], *_point_cells(r)[:3], ratio(r["throughput_ratio"] or math.nan), _mib(r["stub_mib"])]
        for r in section["rows"]
    ]
    counts = ", ".join(str(r["instances"]) for r in section["rows"])
    return [
        f"`{section['model']}` with {counts} instances on the device (`instance_group {{ count: N kind: "
        "KIND_GPU }` on GPU 0; KIND_CPU in a rehearsal), no dynamic batching, "
        f"{section['concurrency']} batch-1 requests in flight.",
        "",
        table(["instances", "inf/s", "p50 ms", "p99 ms", "vs 1 instance", "stub MiB each"], rows),
    ]


def _pipeline_lines(section: dict) -> list[str]:
    rows = [
        [row["model"], batch, _ms(point["client_ms"]), f"{point['boundary_bytes']:,}"]
        for row in section["rows"]
        for batch, point in row["batches"].items()
    ]
    throughput = [
        [r["model"], r["throughput"]["concurrency"], *_point_cells(r["throughput"])[:3]]
        for r in section["rows"]
    ]
    return [
        "The image classifier as one model and as two stages on the device (an ensemble; both stages on "
        "GPU 0), with the activation crossing the boundary in fp32 or fp16: latency one request at a time, "
        "bytes crossing the boundary per request.",
        "",
        table(["model", "batch", "client ms", "boundary bytes"], rows),
        "",
        table(["model", "concurrency", "inf/s", "p50 ms", "p99 ms"], throughput),
    ]


def _shm_lines(section: dict) -> list[str]:
    rows = [
        [r["transport"], _ms(r["median_ms"]), _ms(r["p90_ms"]), number(r["mib_per_s"]), _yes(r["correct"])]
        for r in section["rows"]
    ]
    return [
        f"`{section['model']}` (doubles its input): one input of {section['input_bytes']:,} bytes and an "
        "output as large, one request at a time, in the gRPC message, through one system shared-memory "
        "region, or one CUDA shared-memory region (the tensors stay on the GPU).",
        "",
        table(["transport", "median ms", "p90 ms", "MiB/s moved", "answer right"], rows),
        *(f"- not measured: {item}" for item in section.get("not_measured", [])),
    ]


SECTIONS = (
    ("latency", "Latency model on the device", _latency_lines),
    ("parity", "fp16 and fp32 outputs against fp32", _parity_lines),
    ("memory", "Memory per instance against the planner", _memory_lines),
    ("batching", "Dynamic batching against none", _batching_lines),
    ("instances", "Instances on one GPU", _instance_lines),
    ("pipeline", "Two-stage pipeline against the monolith", _pipeline_lines),
    ("shared_memory", "CUDA shared memory, system shared memory, gRPC", _shm_lines),
)


def _heading(document: dict) -> str:
    facts, check = document["machine"], document["check"]
    gpu = facts["device"] != "cpu"
    where = f"driver {facts['driver']}" if gpu else "no GPU: a rehearsal"
    placement = "KIND_GPU instance groups on GPU 0" if gpu else "KIND_CPU instance groups"
    return (
        f"Measured on **{facts['device']}** ({where}), Python {facts['python']}, torch {facts['torch']} "
        f"(CUDA {facts['torch_cuda']}), numpy {facts['numpy']}, {facts['cpu_count']} CPUs; grid "
        f"`{check['grid']['name']}`, {number(check['wall_s'])} s in all. The served path is tritonserver "
        f"2.51 (the nvidia-pytriton wheel) running torch through the Python backend on {placement}; the "
        f"stub's libpython: {facts['libpython'] or 'not set up'}. Reproduce: `{check['command']}`."
    )


def _profile_lines(profile: dict) -> list[str]:
    rows = [
        [model, precision, f"{p['T_ms']:.4f}", f"{p['dt_ms']:.5f}", len(p["batches"])]
        for model, by_precision in profile["models"].items()
        for precision, p in by_precision.items()
    ]
    return [
        f"What `make plan --compute-profile {FIGURES}` reads (device `{profile['device']}`).",
        "",
        table(["model", "precision", "T ms", "Δt ms", "batch sizes"], rows),
    ]


def markdown(document: dict) -> list[str]:
    sections = document["sections"]
    lines = ["# GPU check", "", _heading(document), "", "## Steps", "", *_status_lines(sections)]
    if document["compute_profile"]["models"]:
        lines += ["", "## Compute profile (raw torch)", "", *_profile_lines(document["compute_profile"])]
    for name, title, render in SECTIONS:
        section, status = _ok(sections, name), sections.get(name, {}).get("status", "not run")
        lines += ["", f"## {title}", ""]
        lines += render(section) if section else [f"Not measured: {status}."]
    lines += ["", "## Not measured here", ""]
    lines += [f"- **{item['what']}**: {item['why']}." for item in document["not_measured"]]
    return lines


def _plot_latency(document: dict, path: Path) -> Path:
    figure, axes = plt.subplots(figsize=(7, 4.5))
    latency = _ok(document["sections"], "latency")
    for name, model in (latency or {}).get("models", {}).items():
        batches = [int(b) for b in model["batches"]]
        line = axes.plot(
            batches, [p["client_ms"] for p in model["batches"].values()], marker="o", label=f"{name} served"
        )
        raw = [p["raw_ms"] for p in model["batches"].values()]
        if all(r is not None for r in raw):
            axes.plot(batches, raw, "--", color=line[0].get_color(), label=f"{name} raw torch")
    axes.set(xscale="log", yscale="log", xlabel="batch size", ylabel="ms per batch", title="T + (N−1)·Δt")
    return save_figure(figure, path, axes, grid="both")


def _plot_throughput(document: dict, path: Path) -> Path:
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2))
    batching = _ok(document["sections"], "batching")
    if batching:
        concurrency = [p["concurrency"] for p in batching["points"]]
        for mode in ("none", "dynamic"):
            left.plot(
                concurrency, [p[mode]["throughput"] for p in batching["points"]], marker="o", label=mode
            )
    left.set(xscale="log", xlabel="requests in flight", ylabel="inferences / s", title="dynamic batching")
    instances = _ok(document["sections"], "instances")
    if instances:
        right.bar(
            [str(r["instances"]) for r in instances["rows"]], [r["throughput"] for r in instances["rows"]]
        )
    right.set(xlabel="instances on GPU 0", ylabel="inferences / s", title="instances")
    return save_figure(figure, path, left if batching else None, grid="both")


def _plot_transfer(document: dict, path: Path) -> Path:
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2))
    pipeline = _ok(document["sections"], "pipeline")
    for row in (pipeline or {}).get("rows", []):
        batches = [int(b) for b in row["batches"]]
        left.plot(batches, [p["client_ms"] for p in row["batches"].values()], marker="o", label=row["model"])
    left.set(xlabel="batch size", ylabel="ms per request", title="pipeline vs monolith")
    shm = _ok(document["sections"], "shared_memory")
    if shm:
        right.bar([r["transport"] for r in shm["rows"]], [r["median_ms"] for r in shm["rows"]])
    right.set(ylabel="ms per request (median)", title="transport of one large input")
    return save_figure(figure, path, left if pipeline else None, grid="both")


def write(out: Path, document: dict) -> list[Path]:
    """The JSON first (every figure survives a failed render), then the report and plots from it."""
    document = json.loads(json.dumps(document, default=plain))
    written = [write_report(out / REPORT, markdown(document), document, out / FIGURES), out / FIGURES]
    for render, name in zip((_plot_latency, _plot_throughput, _plot_transfer), PLOTS, strict=True):
        written.append(render(document, out / name))
    return written


def summary(document: dict) -> str:
    """A short table for the end of the command's output (the device tool returns the tail)."""
    rows = [[n, s["status"], number(s.get("seconds", math.nan))] for n, s in document["sections"].items()]
    return table(["step", "status", "s"], rows) + "\n\n" + _profile_lines(document["compute_profile"])[-1]
