"""Where a served execution's time goes (docs/PERF.md): the recommender's ``compute_infer`` and stub CPU
per execution at batch 1 and 8, served as ``before`` (``--baseline``'s backend), ``after`` (this
checkout's), ``bare`` and ``floor`` (``stub_cost_models/``), beside raw onnxruntime hot and cold. The
two models of a pair (``PAIRS``) are driven at once, so the host's other work falls on both alike."""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient
from google.protobuf import text_format

import python_backend
from client.stats import fetch_stats
from exporters.configs.model_config import read_config
from exporters.repository import scratch_repository, spec_entry
from perf.measure.analyzer import PerfAnalyzerEngine, find_perf_analyzer
from perf.measure.engine import MeasureSettings
from perf.measure.loads import closed_loop
from perf.measure.measurement import measure
from perf.measure.raw import measure_raw
from perf.measure.server_view import process_tree_cpu_s
from perf.measure.target import target_from_spec
from python_backend.onnxruntime.ort_session import open_session
from server import ServerOptions, TritonServer
from server.stubs import server_stubs

MODEL = "recommender"
VARIANTS = ("before", "after", "bare", "floor")
PAIRS = (("before", "after"), ("bare", "floor"))  # measured at the same time
OWN_MODELS = Path(__file__).parent / "stub_cost_models"  # bare.py, floor.py: served as model.py
BATCHES = (1, 8)
EVICT_BYTES = 16 * 2**20  # more than this host's caches
COLUMNS = ("before", "after", "after/before", "cheaper in", "floor", "bare-floor", "raw", "after-bare")
Series = dict[tuple[str, str, int], list[float]]  # (figure, variant, batch) -> one figure per round


def _entries(spec_path: Path) -> list[dict]:
    """The recommender once per variant, without its queue policy (on Triton 2.51 it stalls the batcher
    now and then) and with a batcher that forms batches of 8 when 8 requests are in flight."""
    entry = spec_entry(spec_path, MODEL)
    entry["batching"] = {"mode": "dynamic", "max_queue_delay_us": 2000, "preferred_batch_sizes": [8]}
    return [{**entry, "name": f"{MODEL}_{variant}"} for variant in VARIANTS]


def _serve_from(model_dir: Path, variant: str, backend_files: Path | None) -> None:
    """Serve ``model_dir`` on the Python backend with the backend files of ``backend_files`` (a
    ``python_backend`` folder), or where it is None ``OWN_MODELS``'s model of that ``variant``."""
    version = model_dir / "1"
    if backend_files is None:  # with the runtime helper that finds the venv's packages, as ours do
        (version / "model.py").write_bytes((OWN_MODELS / f"{variant}.py").read_bytes())
        (version / "runtime_paths.py").write_bytes(Path(python_backend.HERE, "runtime_paths.py").read_bytes())
    for name in python_backend.ONNXRUNTIME_BACKEND if backend_files else ():
        source = backend_files / name
        if not source.is_file():
            raise SystemExit(f"{source} is missing: --baseline must be a checkout of this project")
        (version / Path(name).name).write_bytes(source.read_bytes())
    config = read_config(model_dir / "config.pbtxt")
    config.backend = "python"
    config.ClearField("default_model_filename")
    (model_dir / "config.pbtxt").write_text(text_format.MessageToString(config))


@dataclass(frozen=True)
class Figures:
    """One model's executions of one batch size, their ``compute_infer``, all executions, its stub's CPU."""

    executions: int
    infer_ns: int
    all_executions: int
    stub_cpu_s: float

    @classmethod
    def read(cls, server: TritonServer, model: str, batch: int) -> Figures:
        client = httpclient.InferenceServerClient(server.http_url)
        (entry,) = fetch_stats(client, "http", model).get("model_stats", [])
        bucket = next((b for b in entry.get("batch_stats", []) if int(b["batch_size"]) == batch), {})
        infer = bucket.get("compute_infer", {})
        (stub,) = [s for s in server_stubs(server.pid or 0) if s.model == model and s.alive]
        return cls(
            int(infer.get("count", 0)),
            int(infer.get("ns", 0)),
            int(entry.get("execution_count", 0)),
            process_tree_cpu_s(stub.pid),
        )


def _served(
    server: TritonServer, target, batch: int, settings: MeasureSettings, engine
) -> tuple[float, float]:
    """``compute_infer`` ms per execution of ``batch`` requests with ``batch`` in flight, and the stub's
    CPU ms per execution (any size: at 8 in flight nearly all are 8)."""
    before = Figures.read(server, target.model, batch)
    measure(target, closed_loop(batch), settings, engine=engine)
    after = Figures.read(server, target.model, batch)
    if after.executions <= before.executions:
        raise SystemExit(f"{target.model}: no execution of batch {batch} was formed")
    infer_ms = (after.infer_ns - before.infer_ns) / (after.executions - before.executions) / 1e6
    cpu_ms = 1e3 * (after.stub_cpu_s - before.stub_cpu_s) / (after.all_executions - before.all_executions)
    return infer_ms, cpu_ms


def _raw_cold_cpu_ms(onnx_path: Path, inputs: dict, batch: int, runs: int = 200) -> float:
    """Raw onnxruntime's CPU ms per run with ``EVICT_BYTES`` touched between runs, as the other processes
    of a served execution touch theirs: the run with cold caches."""
    session = open_session(str(onnx_path), 1, 1, ["CPUExecutionProvider"])
    feeds = {name: pool[:batch] for name, pool in inputs.items()}
    junk, spent = np.zeros(EVICT_BYTES // 8), 0.0
    for _ in range(runs):
        junk += 1.0
        started = time.thread_time()
        session.run(None, feeds)
        spent += time.thread_time() - started
    return 1e3 * spent / runs


def _line(batch: int, what: str, series: Series) -> str:
    """One figure's row: medians over rounds, the rounds' after/before and the split of ``after``."""
    median = {v: statistics.median(series[what, v, batch]) for v in (*VARIANTS, "raw")}
    ratios = [a / b for a, b in zip(series[what, "after", batch], series[what, "before", batch], strict=True)]
    figures = (f"{median['before']:.3f}", f"{median['after']:.3f}", f"{statistics.median(ratios):.2f}",
               f"{sum(r < 1 for r in ratios)}/{len(ratios)}", f"{median['floor']:.3f}",
               f"{median['bare'] - median['floor']:.3f}", f"{median['raw']:.3f}",
               f"{median['after'] - median['bare']:.3f}")  # fmt: skip
    cells = " ".join(f"{v:>{max(len(n), 7)}}" for v, n in zip(figures, COLUMNS, strict=True))
    rounds = ", ".join(f"{r:.2f}" for r in ratios)
    return f"{batch:>5} {what:>8} {cells}\n{'':>15}rounds' after/before: {rounds}"


def _round(
    number: int, server: TritonServer, targets: dict, onnx_path: Path, series: Series, settings, engine
) -> None:
    """One round: both pairs at both batches (the pairs' order alternating), then raw onnxruntime."""
    pairs = PAIRS[number % 2 :] + PAIRS[: number % 2]
    for batch in BATCHES:
        for pair in pairs:
            with ThreadPoolExecutor(len(pair)) as pool:
                runs = {v: pool.submit(_served, server, targets[v], batch, settings, engine) for v in pair}
            for variant, run in runs.items():
                infer_ms, cpu_ms = run.result()
                series["wall", variant, batch].append(infer_ms)
                series["CPU", variant, batch].append(cpu_ms)
                figures = f"{infer_ms:7.3f} ms, CPU {cpu_ms:7.3f} ms"
                print(f"round {number + 1} batch {batch} {variant:6} {figures}", flush=True)
    inputs = targets["after"].inputs
    for point in measure_raw(onnx_path, inputs, BATCHES, seconds=1.0):
        series["wall", "raw", point.batch].append(point.batch_ms)
        series["CPU", "raw", point.batch].append(point.cpu_s_per_1000 * point.batch)  # CPU ms per run
        series["cold", "raw", point.batch].append(_raw_cold_cpu_ms(onnx_path, inputs, point.batch))
        print(f"round {number + 1} batch {point.batch} raw    {point.batch_ms:7.3f} ms", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--baseline", type=Path, required=True, help="another checkout of this project")
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--window-ms", type=int, default=800)
    parser.add_argument("--spec", type=Path, default=Path("models.yaml"))
    args = parser.parse_args()
    binary = find_perf_analyzer()
    if binary is None:
        raise SystemExit("no perf_analyzer: run `make perf-analyzer` first")
    engine = PerfAnalyzerEngine(binary)
    # only the server's statistics are read, which count every execution whether windows agreed or not
    settings = MeasureSettings(warmup_s=0.0, window_s=args.window_ms / 1000, max_windows=4, tolerance=1.0)
    sources = {"before": args.baseline / "python_backend", "after": Path(python_backend.__file__).parent}
    series: Series = defaultdict(list)
    with scratch_repository(_entries(args.spec)) as (spec, repository):
        for variant in VARIANTS:
            _serve_from(repository / f"{MODEL}_{variant}", variant, sources.get(variant))
        onnx_path = repository / f"{MODEL}_after" / "1" / "model.onnx"
        with TritonServer(ServerOptions(repository=repository, self_heal=False)) as server:
            targets = {
                v: target_from_spec(spec.model(f"{MODEL}_{v}"), server.grpc_url, rows=16) for v in VARIANTS
            }
            for number in range(args.rounds):
                _round(number, server, targets, onnx_path, series, settings, engine)
    print("\nmedians over rounds, ms per execution. wall: compute_infer (raw: session.run's time); CPU: the")
    print("stub process's user + system time per execution (raw: this process's CPU per session.run)")
    print(f"{'batch':>5} {'':>8} " + " ".join(f"{name:>{max(len(name), 7)}}" for name in COLUMNS))
    for batch in BATCHES:
        print(_line(batch, "wall", series))
        print(_line(batch, "CPU", series))
        cold = statistics.median(series["cold", "raw", batch])
        print(f"{'':>15}raw onnxruntime's CPU with caches cold between runs: {cold:.3f} ms")


if __name__ == "__main__":
    main()
