"""What the fronts cost (docs/SERVING.md, "What the fronts cost"): perf_analyzer on the recommender
(without its queue policy, whose 2.51 stalls would swamp every route) straight to Triton's own port
(``direct``, with the front key), through each front, and through caddy's plain proxy (``--caddy``),
the routes rotated each round so all see the same moment of a shared machine. ``--profile FILE``
adds one run through a second gRPC front under cProfile (read the shares, not its rate)."""

from __future__ import annotations

import argparse
import contextlib
import os
import pstats
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from client.stats import ModelStats, model_stats
from exporters.repository import scratch_repository, spec_entry
from perf.errors import StudyError
from perf.markdown import table as markdown_table
from perf.measure.analyzer import PerfAnalyzerEngine, find_perf_analyzer
from perf.measure.engine import MeasureSettings
from perf.measure.loads import closed_loop
from perf.measure.measurement import measure
from perf.measure.server_view import process_tree_cpu_s
from perf.measure.target import Target
from server import ServerOptions, TritonServer
from server.admin import FRONT_HEADER, GRPC_FRONT_HEADER, KEY_ENV
from server.ports import free_port, free_ports

MODEL = "recommender"


@dataclass(frozen=True)
class Route:
    name: str
    url: str
    pid: int | None  # the process in between (front or proxy), whose CPU is the route's cost
    header: tuple[str, ...] = ()  # perf_analyzer options (the front key on the direct route)


@dataclass
class Figures:
    """One route's run: perf_analyzer's figures and what the run cost."""

    throughput: float
    p50_ms: float
    p99_ms: float
    between_ms: float  # CPU of the process in between, per request
    server_ms: float  # CPU of tritonserver and its stubs, per request
    batch: float  # mean formed batch


@dataclass
class Rounds:
    """Every round's figures of each route, for one protocol and concurrency."""

    routes: list[str]
    rounds: list[dict[str, Figures]] = field(default_factory=list)

    def median(self, route: str, value: str) -> float:
        return statistics.median(getattr(r[route], value) for r in self.rounds)

    def ratio(self, route: str, value: str) -> tuple[float, list[float]]:
        """The median over rounds of ``route``'s ``value`` over the direct route's, and each round's."""
        each = [getattr(r[route], value) / getattr(r["direct"], value) for r in self.rounds]
        return statistics.median(each), each


def _inputs(rows: int = 16) -> dict[str, np.ndarray]:
    """ids below 10 fit every embedding table of the recommender."""
    rng = np.random.default_rng(0)
    return {
        "dense": rng.standard_normal((rows, 13)).astype(np.float32),
        "sparse_ids": rng.integers(0, 10, (rows, 8)).astype(np.int64),
    }


CADDYFILE = """{{
    admin off
    auto_https off
    servers {{
        protocols h1 h2c
    }}
}}
http://127.0.0.1:{3} {{
    reverse_proxy h2c://{0.triton_grpc_url} {{
        header_up {1} {0.admin_key}
    }}
}}
http://127.0.0.1:{4} {{
    reverse_proxy http://{0.triton_http_url} {{
        header_up {2} {0.admin_key}
    }}
}}
"""


@contextmanager
def caddy_proxy(binary: Path, server: TritonServer) -> Iterator[tuple[subprocess.Popen, str, str]]:
    """caddy in front of Triton's own ports, adding the front key: (process, gRPC url, HTTP url)."""
    grpc_port, http_port = free_ports(["127.0.0.1"] * 2)  # picked together: never the same port twice
    with tempfile.TemporaryDirectory() as folder:
        caddyfile = Path(folder, "Caddyfile")
        caddyfile.write_text(CADDYFILE.format(server, GRPC_FRONT_HEADER, FRONT_HEADER, grpc_port, http_port))
        process = subprocess.Popen(
            [str(binary), "run", "--config", str(caddyfile), "--adapter", "caddyfile"],
            stdout=subprocess.DEVNULL,
            stderr=open(Path(folder, "caddy.log"), "w"),  # noqa: SIM115 (closed with the folder)
            env={"HOME": folder, "XDG_DATA_HOME": folder, "XDG_CONFIG_HOME": folder},
        )
        try:
            for port in (grpc_port, http_port):
                _wait_listening(port, process, Path(folder, "caddy.log"), "caddy")
            yield process, f"127.0.0.1:{grpc_port}", f"127.0.0.1:{http_port}"
        finally:
            process.terminate()
            process.wait(timeout=10)


def _wait_listening(port: int, process: subprocess.Popen, log: Path, name: str, wait_s: float = 20.0) -> None:
    """Return once something listens on ``port``; ``SystemExit`` with ``name``'s log if it exits first."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{name} exited: {log.read_text()[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return
        time.sleep(0.2)
    raise SystemExit(f"{name} did not listen on {port} within {wait_s:g} s: {log.read_text()[-2000:]}")


def profile_grpc_front(
    server: TritonServer, concurrency: int, args: argparse.Namespace, binary: Path
) -> None:
    """One run through a second gRPC front under cProfile with the server's front's flags (read from
    ``/proc``: the launcher keeps them nowhere else); it writes ``args.profile`` on SIGTERM."""
    assert server.grpc_front is not None
    flags = Path(f"/proc/{server.grpc_front.pid}/cmdline").read_bytes().decode().split("\0")[3:-1]
    port = free_port()
    flags = [f"--listen=127.0.0.1:{port}" if flag.startswith("--listen=") else flag for flag in flags]
    profiler = [sys.executable, "-m", "cProfile", "-o", str(args.profile)]
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder, "front.log")
        with log.open("wb") as output:
            process = subprocess.Popen(
                [*profiler, "-m", "server.fronts.grpc_front", *flags],
                stdout=output,
                stderr=subprocess.STDOUT,
                env={**os.environ, KEY_ENV: server.admin_key},
            )
        try:
            _wait_listening(port, process, log, "the profiled gRPC front")
            route = Route("profiled", f"127.0.0.1:{port}", process.pid)
            f = run_route(server, route, "grpc", concurrency, args.window_ms, binary)
        finally:
            process.terminate()
            process.wait(timeout=30)
    print(
        f"grpc, profiled front, concurrency {concurrency}: {f.throughput:.0f} inf/s, p50 {f.p50_ms:.2f} ms, "
        f"{f.between_ms:.3f} ms front CPU/request under cProfile; statistics in {args.profile}"
    )
    print("share of the front's busy time (its own time per function, grouped; waiting in epoll apart):")
    for share, part in busy_shares(args.profile):
        print(f"  {100 * share:5.1f}%  {part}")
    pstats.Stats(str(args.profile)).sort_stats("tottime").print_stats(20)


def busy_shares(statistics_file: Path) -> list[tuple[float, str]]:
    """A profile's own time by where it was spent (each ``server/fronts`` module, asyncio, sockets, HPACK,
    protobuf, the rest; a builtin's in its caller) as shares of the time not in epoll, whose comes first."""

    def part_of(file: str) -> str:
        if "server/fronts/" in file:
            return file.split("server/fronts/")[1]
        known = ("asyncio", "asyncio loop"), ("hpack", "HPACK"), ("protobuf", "protobuf")
        return next((name for key, name in known if key in file), "other")

    spent: dict[str, float] = {}
    for (file, _, function), (_, _, own_s, _, callers) in pstats.Stats(str(statistics_file)).stats.items():
        if "epoll" in function:
            parts = [("idle: waiting in epoll", own_s)]
        elif "_socket.socket" in function:
            parts = [("socket calls (send, recv)", own_s)]
        elif file == "~" and callers:  # a builtin: its time where it was called from
            parts = [(part_of(caller[0]), times[2]) for caller, times in callers.items()]
        else:
            parts = [(part_of(file), own_s)]
        for part, seconds in parts:
            spent[part] = spent.get(part, 0.0) + seconds
    idle = spent.pop("idle: waiting in epoll", 0.0)
    busy = sum(spent.values()) or 1.0
    shares = sorted(((own_s / busy, part) for part, own_s in spent.items()), reverse=True)
    return [(idle / (idle + busy), "idle: waiting in epoll (of all its time)"), *shares]


def routes(
    server: TritonServer, protocol: str, proxy: tuple[subprocess.Popen, str, str] | None
) -> list[Route]:
    """Where perf_analyzer connects for ``protocol``: Triton's own port, the front, the proxy."""
    grpc = protocol == "grpc"
    front = server.grpc_front if grpc else server.http_front
    assert front is not None
    own, header = (
        (server.triton_grpc_url, GRPC_FRONT_HEADER) if grpc else (server.triton_http_url, FRONT_HEADER)
    )
    found = [
        Route("direct", own, None, ("-H", f"{header}:{server.admin_key}")),
        Route("front", server.grpc_url if grpc else server.http_url, front.pid),
    ]
    if proxy is not None:
        found.append(Route("proxy", proxy[1] if grpc else proxy[2], proxy[0].pid))
    return found


def _stats(server: TritonServer) -> ModelStats:
    return model_stats(httpclient.InferenceServerClient(server.triton_http_url), "http", MODEL)


def run_route(
    server: TritonServer, route: Route, protocol: str, concurrency: int, window_ms: int, binary: Path
) -> Figures:
    """One perf_analyzer run on ``route``; ``StudyError`` when its windows never agree (within 100%:
    as generous as a shared machine needs)."""
    settings = MeasureSettings(warmup_s=0.0, window_s=window_ms / 1000, max_windows=4, tolerance=1.0)
    stats = _stats(server)
    between, own = process_tree_cpu_s(route.pid or 0), process_tree_cpu_s(server.pid or 0)
    target = Target(MODEL, route.url, _inputs(), {}, protocol)
    result = measure(
        target, closed_loop(concurrency), settings, engine=PerfAnalyzerEngine(binary, extra=route.header)
    ).own
    if result is None:
        raise StudyError("perf_analyzer wrote no figures: its windows did not agree")
    done = _stats(server) - stats
    requests = max(done.requests, 1)
    return Figures(
        result.throughput,
        result.p50_ms,
        result.p99_ms,
        1000 * (process_tree_cpu_s(route.pid) - between) / requests if route.pid else 0.0,
        1000 * (process_tree_cpu_s(server.pid or 0) - own) / requests,
        done.mean_batch,
    )


def compare(
    server: TritonServer,
    protocol: str,
    concurrency: int,
    found: list[Route],
    args: argparse.Namespace,
    binary: Path,
) -> Rounds:
    """``args.rounds`` rounds over ``found`` in rotated order, printing each run."""
    result = Rounds([route.name for route in found])
    columns = "inf/s, p50 ms, p99 ms, CPU ms/request (between, server), batch"
    print(f"{protocol}, {MODEL}, concurrency {concurrency}: {columns}")
    for number in range(args.rounds):
        order = found[number % len(found) :] + found[: number % len(found)]
        figures: dict[str, Figures] = {}
        for route in order:
            try:
                figures[route.name] = run_route(server, route, protocol, concurrency, args.window_ms, binary)
            except StudyError as error:
                print(f"  round {number + 1} {route.name:6} not stable, round skipped: {str(error)[:80]}")
                break
            f = figures[route.name]
            print(
                f"  round {number + 1} {route.name:6} {f.throughput:8.0f} {f.p50_ms:7.2f} {f.p99_ms:7.2f} "
                f"{f.between_ms:6.3f} {f.server_ms:6.3f} {f.batch:5.2f}",
                flush=True,
            )
        if len(figures) == len(found):
            result.rounds.append(figures)
    return result


def table(results: dict[tuple[str, int], Rounds]) -> str:
    header = ["protocol", "c", "route", "throughput / direct, median (rounds)", "p50 ms (/ direct)",
              "CPU ms/request in between", "server CPU ms/request", "formed batch"]  # fmt: skip
    rows = []
    for (protocol, concurrency), rounds in results.items():
        if not rounds.rounds:
            rows.append([protocol, concurrency, "(no stable round)", "", "", "", "", ""])
            continue
        for route in rounds.routes:
            if route == "direct":
                shown, between = f"{rounds.median(route, 'throughput'):.0f} inf/s", "–"
            else:
                ratio, each = rounds.ratio(route, "throughput")
                shown = f"{ratio:.2f} ({', '.join(f'{v:.2f}' for v in each)})"
                between = f"{rounds.median(route, 'between_ms'):.2f}"
            p50 = f"{rounds.median(route, 'p50_ms'):.2f} ({rounds.ratio(route, 'p50_ms')[0]:.2f}×)"
            server, batch = f"{rounds.median(route, 'server_ms'):.2f}", f"{rounds.median(route, 'batch'):.1f}"
            rows.append([protocol, concurrency, route, shown, p50, between, server, batch])
    return markdown_table(header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--protocols", nargs="+", default=["grpc", "http"], choices=["grpc", "http"])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--window-ms", type=int, default=3000)
    parser.add_argument("--caddy", type=Path, help="a caddy binary: adds the plain proxy route")
    parser.add_argument("--spec", type=Path, default=Path("models.yaml"))
    parser.add_argument(
        "--profile", type=Path, help="where to write a cProfile of the gRPC front (pstats file)"
    )
    args = parser.parse_args()
    binary = find_perf_analyzer()
    if binary is None:
        raise SystemExit("no perf_analyzer: run `make perf-analyzer` first")
    if args.caddy is not None and not args.caddy.is_file():
        raise SystemExit(f"no caddy at {args.caddy}")
    entry = spec_entry(args.spec, MODEL)
    entry["batching"].pop("queue", None)
    results: dict[tuple[str, int], Rounds] = {}
    with scratch_repository([entry]) as (_, repository):
        options = ServerOptions(repository=repository, http_front=True, grpc_front=True, self_heal=False)
        with (
            TritonServer(options) as server,
            caddy_proxy(args.caddy, server) if args.caddy else contextlib.nullcontext() as proxy,
        ):
            for protocol in args.protocols:
                for concurrency in args.concurrency:
                    found = routes(server, protocol, proxy)
                    results[protocol, concurrency] = compare(
                        server, protocol, concurrency, found, args, binary
                    )
            if args.profile is not None:
                profile_grpc_front(server, max(args.concurrency), args, binary)
    print()
    print(table(results))


if __name__ == "__main__":
    main()
