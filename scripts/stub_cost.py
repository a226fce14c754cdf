"""Where a served execution's time goes: Triton's ``compute_infer`` per execution of the recommender at
batch 1 and 8, served by two copies of our python-based onnxruntime backend side by side, with raw
onnxruntime at the same batch.

One server, one repository, two models built from ``models.yaml``'s ``recommender`` (same ONNX file,
same threads): ``recommender_before`` runs the backend files of ``--baseline`` (another checkout of this
project, e.g. ``git worktree add --detach /tmp/main main``) and ``recommender_after`` this checkout's.
Both are served with ``backend: "python"`` and the backend files in their version folder, so each stub
imports its own copy. perf_analyzer drives one model at a time in a closed loop: concurrency 1 for
executions of one request, concurrency 8 for executions of eight requests of one row each (the
batcher prefers 8 and waits up to 2 ms for it). Each round measures both models at both batches, the
models' order rotating from round to round, and times raw onnxruntime in this process while the server
idles. ``compute_infer`` is read from the server's ``batch_stats`` for exactly that batch size, so
executions of other sizes never mix in. Reported per batch: each model's median over rounds, the
median of the rounds' after/before ratios, and raw onnxruntime; served minus raw is what serving adds
per execution (the stub's IPC, Triton's request handling and our Python). Not a test: a measurement to
repeat where the backend changes.

    .venv/bin/python scripts/stub_cost.py --baseline /tmp/main [--rounds 3] [--window-ms 1500]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import tritonclient.http as httpclient
import yaml
from google.protobuf import text_format

import python_backend
from client.stats import fetch_stats
from exporters.model_config import read_config
from exporters.repository import build_repository
from exporters.spec import parse_spec
from perf.measure.analyzer import PerfAnalyzerEngine, find_perf_analyzer
from perf.measure.engine import MeasureSettings
from perf.measure.loads import closed_loop
from perf.measure.measurement import measure
from perf.measure.raw import measure_raw
from perf.measure.target import target_from_spec
from server import ServerOptions, TritonServer

MODEL = "recommender"
VARIANTS = ("before", "after")
BATCHES = (1, 8)


def _spec_data(spec_path: Path) -> dict:
    """The spec's recommender twice (``_before``, ``_after``), without its queue policy (on Triton 2.51
    a queue policy with one instance stalls the batcher ~500 ms now and then, docs/SERVING.md) and with a
    batcher that forms batches of 8 when 8 requests are in flight."""
    data = yaml.safe_load(spec_path.read_text())
    entry = next(m for m in data["models"] if m["name"] == MODEL)
    entry["batching"] = {"mode": "dynamic", "max_queue_delay_us": 2000, "preferred_batch_sizes": [8]}
    data["models"] = [{**entry, "name": f"{MODEL}_{variant}"} for variant in VARIANTS]
    data.pop("pipelines", None), data.pop("text_embeddings", None)
    return data


def _serve_from(model_dir: Path, backend_files: Path) -> None:
    """Serve ``model_dir`` on the Python backend with the onnxruntime backend files of ``backend_files``
    (a ``python_backend`` folder) beside its ``model.onnx``."""
    for name in python_backend.ONNXRUNTIME_BACKEND:
        source = backend_files / name
        if not source.is_file():
            raise SystemExit(f"{source} is missing: --baseline must be a checkout of this project")
        (model_dir / "1" / Path(name).name).write_bytes(source.read_bytes())
    config = read_config(model_dir / "config.pbtxt")
    config.backend = "python"
    config.ClearField("default_model_filename")
    (model_dir / "config.pbtxt").write_text(text_format.MessageToString(config))


def _infer_at(server: TritonServer, model: str, batch: int) -> tuple[int, int]:
    """Executions of exactly ``batch`` and their ``compute_infer`` nanoseconds, so far."""
    client = httpclient.InferenceServerClient(server.http_url)
    for entry in fetch_stats(client, "http", model).get("model_stats", []):
        for bucket in entry.get("batch_stats", []):
            if int(bucket["batch_size"]) == batch:
                infer = bucket.get("compute_infer", {})
                return int(infer.get("count", 0)), int(infer.get("ns", 0))
    return 0, 0


def _served_ms(server: TritonServer, target, batch: int, settings: MeasureSettings, engine) -> float:
    """``compute_infer`` ms per execution of ``batch`` requests while perf_analyzer keeps ``batch`` in
    flight."""
    count, ns = _infer_at(server, target.model, batch)
    measure(target, closed_loop(batch), settings, engine=engine)
    count_after, ns_after = _infer_at(server, target.model, batch)
    if count_after <= count:
        raise SystemExit(f"{target.model}: no execution of batch {batch} was formed")
    return (ns_after - ns) / (count_after - count) / 1e6


def _report(served: dict[tuple[str, int], list[float]], raw: dict[int, list[float]]) -> None:
    print("\nmedian over rounds, ms per execution (compute_infer; raw: session.run):")
    columns = (
        ("before", 8),
        ("after", 8),
        ("after/before", 13),
        ("raw", 7),
        ("before-raw", 11),
        ("after-raw", 10),
    )
    print(f"{'batch':>5} " + " ".join(f"{name:>{width}}" for name, width in columns))
    for batch in BATCHES:
        before, after = served["before", batch], served["after", batch]
        ratios = [a / b for a, b in zip(after, before, strict=True)]
        mb, ma, mr = statistics.median(before), statistics.median(after), statistics.median(raw[batch])
        print(
            f"{batch:>5} {mb:8.3f} {ma:8.3f} {statistics.median(ratios):13.2f} {mr:7.3f} {mb - mr:11.3f} "
            f"{ma - mr:10.3f}   (rounds' ratios: {', '.join(f'{r:.2f}' for r in ratios)})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--baseline", type=Path, required=True, help="another checkout of this project")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window-ms", type=int, default=1500)
    parser.add_argument("--spec", type=Path, default=Path("models.yaml"))
    args = parser.parse_args()
    binary = find_perf_analyzer()
    if binary is None:
        raise SystemExit("no perf_analyzer: run `make perf-analyzer` first")
    engine = PerfAnalyzerEngine(binary)
    # perf_analyzer's own stability check, generous as a shared machine needs; only the server's
    # statistics are read here, and they count every execution whether the windows agreed or not
    settings = MeasureSettings(warmup_s=0.0, window_s=args.window_ms / 1000, max_windows=4, tolerance=1.0)
    spec = parse_spec(_spec_data(args.spec))
    sources = {"before": args.baseline / "python_backend", "after": Path(python_backend.__file__).parent}
    with tempfile.TemporaryDirectory() as folder:
        repository = Path(folder, "repository")
        build_repository(spec, repository, num_gpus=0)
        for variant in VARIANTS:
            _serve_from(repository / f"{MODEL}_{variant}", sources[variant])
        onnx_path = repository / f"{MODEL}_after" / "1" / "model.onnx"
        served: dict[tuple[str, int], list[float]] = {(v, b): [] for v in VARIANTS for b in BATCHES}
        raw: dict[int, list[float]] = {b: [] for b in BATCHES}
        with TritonServer(ServerOptions(repository=repository, self_heal=False)) as server:
            for round_number in range(args.rounds):
                order = VARIANTS[round_number % 2 :] + VARIANTS[: round_number % 2]
                for batch in BATCHES:
                    for variant in order:
                        model_spec = next(m for m in spec.models if m.name == f"{MODEL}_{variant}")
                        target = target_from_spec(model_spec, server.grpc_url, rows=16)
                        ms = _served_ms(server, target, batch, settings, engine)
                        served[variant, batch].append(ms)
                        print(f"round {round_number + 1} batch {batch} {variant:6} {ms:7.3f} ms", flush=True)
                for point in measure_raw(onnx_path, target.inputs, BATCHES, seconds=1.0):
                    raw[point.batch].append(point.batch_ms)
                    print(
                        f"round {round_number + 1} batch {point.batch} raw    {point.batch_ms:7.3f} ms",
                        flush=True,
                    )
        _report(served, raw)


if __name__ == "__main__":
    main()
