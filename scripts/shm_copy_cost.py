"""What the fronts' shared-memory copy costs against Triton mapping the client's file itself
(docs/SERVING.md, "Shared memory through the fronts"): a default and a ``trusted_shared_memory`` server
of ``trivial`` widened to 1 MiB of FP32 a row, and the same request with its tensors in the body;
the routes in turn each round, every route's answer checked once."""

from __future__ import annotations

import argparse
import statistics
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import tritonclient.utils.shared_memory as shm

from client.connection import connect, protocol_module
from client.infer import timed_calls
from client.shm import system_region
from exporters.repository import scratch_repository, spec_entry
from perf.measure.server_view import process_tree_cpu_s
from server import ServerOptions, TritonServer

MODEL = "trivial_wide"
FEATURES = 262_144  # 1 MiB of FP32 per row
ROW_BYTES = 4 * FEATURES
ROUTES = ("copy", "trusted", "body")


def _wide(spec: Path) -> dict:
    return {
        **spec_entry(spec, "trivial"), "name": MODEL, "options": {"features": FEATURES}, "max_batch_size": 16,
        "inputs": [{"name": "x", "dtype": "fp32", "shape": [FEATURES]}],
        "outputs": [{"name": "y", "dtype": "fp32", "shape": [FEATURES]}],
    }  # fmt: skip


class Route:
    """One way to send the request: through a front, its tensors in a region or in the body."""

    def __init__(self, server: TritonServer, protocol: str, rows: int, in_region: bool, stack: ExitStack):
        self.module = protocol_module(protocol)
        self.url = server.http_url if protocol == "http" else server.grpc_url
        self.front = server.http_front if protocol == "http" else server.grpc_front
        self.client = connect(protocol, self.url)
        self.values = np.random.default_rng(rows).standard_normal((rows, FEATURES)).astype(np.float32)
        size = rows * ROW_BYTES
        self.inputs = [self.module.InferInput("x", [rows, FEATURES], "FP32")]
        self.outputs = [
            self.module.InferRequestedOutput("y", **({"binary_data": True} if protocol == "http" else {}))
        ]
        self.handle = None
        if not in_region:
            self.inputs[0].set_data_from_numpy(self.values)
        else:
            region, self.handle = stack.enter_context(system_region(self.client, 2 * size))
            shm.set_shared_memory_region(self.handle, [self.values])
            self.inputs[0].set_shared_memory(region, size)
            self.outputs[0].set_shared_memory(region, size, offset=size)

    def check(self) -> None:
        result = self.client.infer(MODEL, self.inputs, outputs=self.outputs)
        size = self.values.nbytes
        answer = (
            result.as_numpy("y")
            if self.handle is None
            else shm.get_contents_as_numpy(self.handle, np.float32, self.values.shape, offset=size)
        )
        if not np.array_equal(answer, 2 * self.values):
            raise SystemExit(f"{self.url}: a wrong answer; nothing measured is worth reporting")

    def measure(self, requests: int) -> tuple[float, float]:
        """Median ms per request, and the front's CPU ms per request."""
        cpu = process_tree_cpu_s(self.front.pid)
        took = timed_calls(lambda: self.client.infer(MODEL, self.inputs, outputs=self.outputs), requests, 0)
        return statistics.median(took), 1000 * (process_tree_cpu_s(self.front.pid) - cpu) / requests


def _compare(servers: dict[str, TritonServer], protocol: str, rows: int, args: argparse.Namespace) -> None:
    with ExitStack() as stack:
        routes = {
            "copy": Route(servers["copy"], protocol, rows, True, stack),
            "trusted": Route(servers["trusted"], protocol, rows, True, stack),
            "body": Route(servers["copy"], protocol, rows, False, stack),
        }
        print(f"{protocol}, {rows} MiB FP32 input (and output), ms per request (front CPU ms):")
        ratios, rounds = [], []
        for round_number in range(1, args.rounds + 1):
            figures = {}
            for route_name, route in routes.items():
                route.check()
                figures[route_name] = route.measure(args.requests)
            ratio = figures["copy"][0] / figures["trusted"][0]
            ratios.append(ratio)
            rounds.append(figures)
            shown = "  ".join(f"{r} {ms:7.2f} ({cpu:5.2f})" for r, (ms, cpu) in figures.items())
            print(f"  round {round_number}  {shown}  copy/trusted {ratio:.2f}", flush=True)
        listed = ", ".join(f"{r:.2f}" for r in ratios)
        middle = {r: [statistics.median(f[r][i] for f in rounds) for i in (0, 1)] for r in ROUTES}
        medians = "  ".join(f"{r} {ms:7.2f} ({cpu:5.2f})" for r, (ms, cpu) in middle.items())
        print(f"  median   {medians}  copy/trusted {statistics.median(ratios):.2f} (rounds: {listed})")


def _server(repository: Path, mode: str) -> TritonServer:
    options = ServerOptions(repository=repository, http_front=True, grpc_front=True, self_heal=False)
    options.trusted_shared_memory = mode == "trusted"
    return TritonServer(options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=20, help="requests per route, size and round")
    parser.add_argument("--protocols", nargs="+", default=["grpc", "http"], choices=["grpc", "http"])
    parser.add_argument("--spec", type=Path, default=Path("models.yaml"))
    args = parser.parse_args()
    with scratch_repository([_wide(args.spec)]) as (_, repository), ExitStack() as stack:
        servers = {mode: stack.enter_context(_server(repository, mode)) for mode in ("copy", "trusted")}
        for protocol in args.protocols:
            for rows in (1, 16):
                _compare(servers, protocol, rows, args)


if __name__ == "__main__":
    main()
