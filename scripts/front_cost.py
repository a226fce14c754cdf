"""What the fronts cost: perf_analyzer on the recommender at concurrency 16, through a front and
straight to Triton's own port of the same server, run after run in turns.

One server as ``make serve`` runs it (``server.fronts.http_front`` and ``server.fronts.grpc_front`` in
front of Triton's loopback ports). Each round measures the same model twice, once through the front and
once on Triton's own port (perf_analyzer passing the front key, as the fronts do), so both see the same
server, the same batcher and the same moment of a shared machine; the ratios of each round are the
result, with the CPU each route costs per request (the front process's, and tritonserver's with its
stubs', from ``/proc``; requests counted by the server's statistics). The recommender runs without its
queue policy: on Triton 2.51 a queue policy with one instance makes the batcher stall ~500 ms now and
then (docs/SERVING.md), which would swamp both routes alike. A run perf_analyzer cannot make stable is
reported and its round skipped. Not a test: a measurement to repeat where the cost matters.

    .venv/bin/python scripts/front_cost.py [--rounds 5] [--protocols grpc http] [--window-ms 3000]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient
import yaml

from client.stats import model_stats
from exporters.repository import build_repository
from exporters.schema.models import parse_spec
from perf.errors import StudyError
from perf.measure.analyzer import PerfAnalyzerEngine, find_perf_analyzer
from perf.measure.engine import MeasureSettings
from perf.measure.loads import closed_loop
from perf.measure.measurement import measure
from perf.measure.server_view import process_tree_cpu_s
from perf.measure.target import Target
from server import ServerOptions, TritonServer
from server.admin import FRONT_HEADER, GRPC_FRONT_HEADER

MODEL = "recommender"


def _inputs(rows: int = 16) -> dict[str, np.ndarray]:
    """perf_analyzer's input pool; ids below 10 fit every embedding table of the recommender."""
    rng = np.random.default_rng(0)
    return {
        "dense": rng.standard_normal((rows, 13)).astype(np.float32),
        "sparse_ids": rng.integers(0, 10, (rows, 8)).astype(np.int64),
    }


def _routes(server: TritonServer, protocol: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Where perf_analyzer connects, and the header it adds: the front, or Triton's own port."""
    if protocol == "grpc":
        own, header = server.triton_grpc_url, GRPC_FRONT_HEADER
        return {"front": (server.grpc_url, ()), "direct": (own, ("-H", f"{header}:{server.admin_key}"))}
    own, header = server.triton_http_url, FRONT_HEADER
    return {"front": (server.http_url, ()), "direct": (own, ("-H", f"{header}:{server.admin_key}"))}


def _cpu_and_requests(server: TritonServer, front_pid: int) -> tuple[float, float, int]:
    """CPU seconds of the front and of tritonserver with its stubs, and the requests it has counted."""
    stats = model_stats(httpclient.InferenceServerClient(server.triton_http_url), "http", MODEL)
    return process_tree_cpu_s(front_pid), process_tree_cpu_s(server.pid or 0), stats.requests


def _compare(server: TritonServer, protocol: str, args: argparse.Namespace, binary: Path) -> None:
    ratios: dict[str, list[float]] = {"throughput": [], "p50": [], "p99": []}
    front = server.grpc_front if protocol == "grpc" else server.http_front
    assert front is not None
    header = "inf/s, p50 ms, p99 ms, CPU ms per request: front, server"
    # perf_analyzer's own stability check, as generous as a shared machine needs: the last three of at
    # least ten windows within 100% of their mean on throughput and average latency
    settings = MeasureSettings(warmup_s=0.0, window_s=args.window_ms / 1000, max_windows=4, tolerance=1.0)
    print(f"{protocol}, {MODEL}, concurrency {args.concurrency}: {header}")
    for round_number in range(1, args.rounds + 1):
        results = {}
        for route, (url, header) in _routes(server, protocol).items():
            before = _cpu_and_requests(server, front.pid)
            target = Target(MODEL, url, _inputs(), {}, protocol)
            engine = PerfAnalyzerEngine(binary, extra=header)
            try:
                result = measure(target, closed_loop(args.concurrency), settings, engine=engine).own
                if result is None:
                    raise StudyError("perf_analyzer wrote no figures: its windows did not agree")
            except StudyError as error:
                print(f"  round {round_number} {route:6} not stable, round skipped: {str(error)[:80]}")
                break
            results[route] = result
            after = _cpu_and_requests(server, front.pid)
            requests = max(after[2] - before[2], 1)
            front_ms, server_ms = (1000 * (after[i] - before[i]) / requests for i in (0, 1))
            cpu = f"{front_ms:6.2f} {server_ms:6.2f}"
            figures = f"{result.throughput:8.0f} {result.p50_ms:7.2f} {result.p99_ms:7.2f} {cpu}"
            print(f"  round {round_number} {route:6} {figures}", flush=True)
        if len(results) < 2:
            continue
        fronted, direct = results["front"], results["direct"]
        ratios["throughput"].append(fronted.throughput / direct.throughput)
        ratios["p50"].append(fronted.p50_ms / direct.p50_ms)
        ratios["p99"].append(fronted.p99_ms / direct.p99_ms)
    for name, values in ratios.items():
        if not values:
            continue
        shown = ", ".join(f"{v:.2f}" for v in values)
        print(f"  front/direct {name}: median {statistics.median(values):.2f} (rounds: {shown})")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--protocols", nargs="+", default=["grpc"], choices=["grpc", "http"])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--window-ms", type=int, default=3000)
    parser.add_argument("--spec", type=Path, default=Path("models.yaml"))
    args = parser.parse_args()
    binary = find_perf_analyzer()
    if binary is None:
        raise SystemExit("no perf_analyzer: run `make perf-analyzer` first")
    data = yaml.safe_load(args.spec.read_text())
    data["models"] = [m for m in data["models"] if m["name"] == MODEL]
    data["models"][0]["batching"].pop("queue", None)
    data.pop("pipelines", None), data.pop("text_embeddings", None)
    with tempfile.TemporaryDirectory() as folder:
        repository = Path(folder, "repository")
        build_repository(parse_spec(data), repository, num_gpus=0)
        options = ServerOptions(repository=repository, http_front=True, grpc_front=True, self_heal=False)
        with TritonServer(options) as server:
            for protocol in args.protocols:
                _compare(server, protocol, args, binary)


if __name__ == "__main__":
    main()
