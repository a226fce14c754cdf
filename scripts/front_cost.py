"""What the fronts cost: perf_analyzer on the recommender at concurrency 16, through a front and
straight to Triton's own port of the same server, run after run in turns.

One server as ``make serve`` runs it (``server.http_guard`` and ``server.grpc_guard`` in front of
Triton's loopback ports). Each round measures the same model twice, once through the front and once
on Triton's own port (perf_analyzer passing the front key, as the fronts do), so both see the same
server, the same batcher and the same moment of a shared machine; the ratios of each round are the
result. Not a test: a measurement to repeat where the cost matters.

    .venv/bin/python scripts/front_cost.py [--rounds 5] [--protocols grpc http] [--window-ms 3000]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import numpy as np
import yaml

from exporters.repository import build_repository
from exporters.spec import parse_spec
from perf.analyzer import NOISY_MACHINE, find_perf_analyzer, run_perf_analyzer
from server import ServerOptions, TritonServer
from server.admin import FRONT_HEADER, GRPC_FRONT_HEADER

MODEL = "recommender"


def _inputs(rows: int = 16) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "dense": rng.standard_normal((rows, 1, 13)).astype(np.float32),
        "sparse_ids": rng.integers(0, 10_000, (rows, 1, 8)).astype(np.int64),
    }


def _routes(server: TritonServer, protocol: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Where perf_analyzer connects, and the header it adds: the front, or Triton's own port."""
    if protocol == "grpc":
        own, header = server.triton_grpc_url, GRPC_FRONT_HEADER
        return {"front": (server.grpc_url, ()), "direct": (own, ("-H", f"{header}:{server.admin_key}"))}
    own, header = server.triton_http_url, FRONT_HEADER
    return {"front": (server.http_url, ()), "direct": (own, ("-H", f"{header}:{server.admin_key}"))}


def _compare(server: TritonServer, protocol: str, args: argparse.Namespace, binary: Path, out: Path) -> None:
    ratios: dict[str, list[float]] = {"throughput": [], "p50": [], "p99": []}
    print(f"{protocol}, {MODEL}, concurrency {args.concurrency}: inf/s, p50 ms, p99 ms")
    for round_number in range(1, args.rounds + 1):
        results = {}
        for route, (url, header) in _routes(server, protocol).items():
            result = run_perf_analyzer(
                binary, MODEL, url, protocol, args.concurrency, args.window_ms, out, _inputs(),
                extra_args=(*header, *NOISY_MACHINE),
            )  # fmt: skip
            results[route] = result
            figures = f"{result.throughput:8.0f} {result.p50_ms:7.2f} {result.p99_ms:7.2f}"
            print(f"  round {round_number} {route:6} {figures}", flush=True)
        front, direct = results["front"], results["direct"]
        ratios["throughput"].append(front.throughput / direct.throughput)
        ratios["p50"].append(front.p50_ms / direct.p50_ms)
        ratios["p99"].append(front.p99_ms / direct.p99_ms)
    for name, values in ratios.items():
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
    data.pop("pipelines", None), data.pop("text_embeddings", None)
    with tempfile.TemporaryDirectory() as folder:
        repository, out = Path(folder, "repository"), Path(folder, "out")
        out.mkdir()
        build_repository(parse_spec(data), repository, num_gpus=0)
        options = ServerOptions(repository=repository, http_guard=True, grpc_guard=True, self_heal=False)
        with TritonServer(options) as server:
            for protocol in args.protocols:
                _compare(server, protocol, args, binary, out)


if __name__ == "__main__":
    main()
