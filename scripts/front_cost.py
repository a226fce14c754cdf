"""What the fronts cost: perf_analyzer on the recommender through each front, straight to Triton's own
port of the same server, and through a plain compiled proxy (caddy) where one is given, route after
route in turns, at each concurrency asked for.

One server as ``make serve`` runs it (``server.fronts.http_front`` and ``server.fronts.grpc_front`` in
front of Triton's loopback ports). Each round measures the same model on every route: ``direct`` is
Triton's own port (perf_analyzer passing the front key, as the fronts do), ``front`` the front, and
``proxy`` caddy's h2c / HTTP reverse proxy to Triton's port (adding the front key, checking nothing),
so all see the same server, the same batcher and the same moment of a shared machine. The routes take
turns in a rotated order (round 1: direct, front, proxy; round 2: front, proxy, direct; …), and the
result of a round is each route's throughput and p50 as a ratio of the direct route's in that round;
what is printed is the median over rounds of those ratios, with:

* the CPU each route costs per request: the front's (or caddy's) process, and tritonserver's with its
  stubs, from ``/proc``, over the requests the server's statistics counted during that route's run;
* the mean batch Triton formed on that route (inferences per execution in its statistics): a route
  that delays requests unevenly makes the batcher form smaller batches, which costs the server CPU.

The recommender runs without its queue policy: on Triton 2.51 a queue policy with one instance makes
the batcher stall ~500 ms now and then (docs/SERVING.md), which would swamp every route alike. A run
perf_analyzer cannot make stable is reported and its round skipped. Not a test: a measurement to repeat
where the cost matters. caddy comes from Debian (``apt-get download caddy && dpkg -x caddy_*.deb DIR``;
the binary is ``DIR/usr/bin/caddy``); without ``--caddy`` the proxy route is left out.

``--profile FILE`` says where the gRPC front's time goes: after the rounds, a second gRPC front with the
same flags as the server's runs under cProfile beside it, perf_analyzer runs once through it at the
highest concurrency asked, and its statistics are written to FILE (``pstats``) and their top printed.
cProfile slows the Python it counts, so read the shares, not the rate.

    .venv/bin/python scripts/front_cost.py [--rounds 3] [--protocols grpc http] [--concurrency 1 4 16]
        [--caddy PATH] [--window-ms 3000] [--profile FILE]
"""

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
from exporters.repository import build_repository
from exporters.schema.bounded_yaml import load_spec_document
from exporters.schema.models import parse_spec
from perf.errors import StudyError
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
    pid: int | None  # the process in between (front or proxy): its CPU is the route's cost
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
    """perf_analyzer's input pool; ids below 10 fit every embedding table of the recommender."""
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
http://127.0.0.1:{grpc_port} {{
    reverse_proxy h2c://{triton_grpc} {{
        header_up {grpc_header} {key}
    }}
}}
http://127.0.0.1:{http_port} {{
    reverse_proxy http://{triton_http} {{
        header_up {http_header} {key}
    }}
}}
"""


@contextmanager
def caddy_proxy(binary: Path, server: TritonServer) -> Iterator[tuple[subprocess.Popen, str, str]]:
    """caddy in front of Triton's own ports, adding the front key: (process, gRPC url, HTTP url)."""
    grpc_port, http_port = free_ports(["127.0.0.1"] * 2)  # picked together: never the same port twice
    with tempfile.TemporaryDirectory() as folder:
        caddyfile = Path(folder, "Caddyfile")
        caddyfile.write_text(
            CADDYFILE.format(
                grpc_port=grpc_port,
                http_port=http_port,
                key=server.admin_key,
                triton_grpc=server.triton_grpc_url,
                grpc_header=GRPC_FRONT_HEADER,
                triton_http=server.triton_http_url,
                http_header=FRONT_HEADER,
            )
        )
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


@contextmanager
def profiled_grpc_front(server: TritonServer, statistics_file: Path) -> Iterator[Route]:
    """A second gRPC front under cProfile, with the flags of the server's own (read from ``/proc``, as the
    launcher keeps them nowhere else) on a port of its own: the route through it. Its statistics are
    written to ``statistics_file`` when it stops on SIGTERM, as a front does for ``make stop``."""
    assert server.grpc_front is not None
    flags = Path(f"/proc/{server.grpc_front.pid}/cmdline").read_bytes().decode().split("\0")[3:-1]
    port = free_port()
    flags = [f"--listen=127.0.0.1:{port}" if flag.startswith("--listen=") else flag for flag in flags]
    profiler = [sys.executable, "-m", "cProfile", "-o", str(statistics_file)]
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
            yield Route("profiled", f"127.0.0.1:{port}", process.pid)
        finally:
            process.terminate()
            process.wait(timeout=30)


def profile_grpc_front(
    server: TritonServer, concurrency: int, args: argparse.Namespace, binary: Path
) -> None:
    """One perf_analyzer run through a profiled gRPC front; prints its figures and the profile's top."""
    with profiled_grpc_front(server, args.profile) as route:
        f = run_route(server, route, "grpc", concurrency, args.window_ms, binary)
    print(
        f"grpc, profiled front, concurrency {concurrency}: {f.throughput:.0f} inf/s, p50 {f.p50_ms:.2f} ms, "
        f"{f.between_ms:.3f} ms front CPU/request under cProfile; statistics in {args.profile}"
    )
    print("share of the front's busy time (its own time per function, grouped; waiting in epoll apart):")
    for share, part in busy_shares(args.profile):
        print(f"  {100 * share:5.1f}%  {part}")
    pstats.Stats(str(args.profile)).sort_stats("tottime").print_stats(20)


def busy_shares(statistics_file: Path) -> list[tuple[float, str]]:
    """A profile's own time grouped by where it was spent: each module of ``server/fronts``, the asyncio
    loop, socket calls, HPACK, protobuf, the rest; as shares of the time not spent waiting in epoll
    (whose share of the whole is the first entry), largest first. A builtin's time counts for whoever
    called it (``len`` in ``h2c`` is ``h2c``'s time)."""

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
    """One perf_analyzer run on ``route``; ``StudyError`` when its windows never agree."""
    # perf_analyzer's own stability check, as generous as a shared machine needs: the last three of at
    # least ten windows within 100% of their mean on throughput and average latency
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
    """``args.rounds`` rounds over ``found``, in rotated order; prints each run."""
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
    """The medians as a markdown table: one row per protocol, concurrency and route."""
    lines = [
        "| protocol | c | route | throughput / direct, median (rounds) | p50 ms (/ direct) "
        "| CPU ms/request in between | server CPU ms/request | formed batch |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (protocol, concurrency), rounds in results.items():
        if not rounds.rounds:
            lines.append(f"| {protocol} | {concurrency} | (no stable round) | | | | | |")
            continue
        for route in rounds.routes:
            ratio, each = rounds.ratio(route, "throughput")
            p50 = f"{rounds.median(route, 'p50_ms'):.2f} ({rounds.ratio(route, 'p50_ms')[0]:.2f}×)"
            shown = (
                f"{ratio:.2f} ({', '.join(f'{v:.2f}' for v in each)})"
                if route != "direct"
                else (f"{rounds.median(route, 'throughput'):.0f} inf/s")
            )
            between = f"{rounds.median(route, 'between_ms'):.2f}" if route != "direct" else "–"
            lines.append(
                f"| {protocol} | {concurrency} | {route} | {shown} | {p50} | {between} | "
                f"{rounds.median(route, 'server_ms'):.2f} | {rounds.median(route, 'batch'):.1f} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
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
    data = load_spec_document(args.spec)
    data["models"] = [m for m in data["models"] if m["name"] == MODEL]
    data["models"][0]["batching"].pop("queue", None)
    data.pop("pipelines", None), data.pop("text_embeddings", None)
    results: dict[tuple[str, int], Rounds] = {}
    with tempfile.TemporaryDirectory() as folder:
        repository = Path(folder, "repository")
        build_repository(parse_spec(data), repository, num_gpus=0)
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
