"""What the stub watchdog costs the host it guards (docs/SERVING.md, "Self-healing: the stub watchdog"):
the CPU seconds per minute of its thread beside an idle server of ``--models`` copies of ``trivial``,
and, timed on this thread alone, one poll (the metrics are read once a second, so in few of them), a
fresh scan of ``/proc`` for stubs and the stubs' activity. On two cores every such CPU second is taken
from the server being measured."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path

from exporters.repository import scratch_repository, spec_entry
from server import ServerOptions, TritonServer
from server.stubs import activity, server_stubs
from server.watchdog import POLL_S

SPEC = Path(__file__).resolve().parents[1] / "models.yaml"


def thread_cpu_s(native_id: int) -> float:
    """CPU seconds a thread of this process has run, in nanoseconds' precision (``schedstat``)."""
    return int(Path(f"/proc/self/task/{native_id}/schedstat").read_text().split()[0]) / 1e9


def per_call_ms(call: Callable[[], object], calls: int) -> float:
    """CPU ms one call takes on this thread."""
    started = time.thread_time()
    for _ in range(calls):
        call()
    return 1000 * (time.thread_time() - started) / calls


def measure(server: TritonServer, seconds: float, calls: int) -> None:
    watchdog = server.watchdog
    assert watchdog is not None and watchdog._thread is not None and server.pid is not None
    stubs = [s for s in server_stubs(server.pid) if s.alive]
    threads = sum(len(os.listdir(f"/proc/{s.pid}/task")) for s in stubs)
    processes = sum(1 for entry in os.listdir("/proc") if entry.isdigit())
    print(f"{len(stubs)} stubs ({threads} threads); {processes} processes on the host")
    tid = watchdog._thread.native_id
    cpu, started = thread_cpu_s(tid), time.monotonic()
    time.sleep(seconds)
    used, took = thread_cpu_s(tid) - cpu, time.monotonic() - started
    per_poll_ms = 1000 * used * POLL_S / took
    print(f"watchdog thread: {60 * used / took:.3f} CPU s a minute ({per_poll_ms:.2f} ms a poll)")
    watchdog.stop()  # each part below is timed on this thread alone
    poll = per_call_ms(watchdog.check_once, calls)  # the metrics are read once a second: in few of them
    scan = per_call_ms(lambda: server_stubs(server.pid), calls)
    moved = per_call_ms(lambda: [activity(s.pid) for s in stubs], calls)
    print(f"one poll {poll:.2f} ms; a fresh /proc scan {scan:.2f} ms; the stubs' activity {moved:.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the watchdog thread is watched")
    parser.add_argument("--calls", type=int, default=200, help="how often each part of a poll is timed")
    parser.add_argument("--ports", type=int, nargs=3, default=(0, 0, 0), metavar=("HTTP", "GRPC", "METRICS"))
    args = parser.parse_args()
    models = [{**spec_entry(SPEC, "trivial"), "name": f"trivial_{n}"} for n in range(args.models)]
    with scratch_repository(models) as (_, repository):
        http, grpc, metrics = args.ports
        options = ServerOptions(repository=repository, http_port=http, grpc_port=grpc, metrics_port=metrics)
        with TritonServer(options) as server:
            measure(server, args.seconds, args.calls)


if __name__ == "__main__":
    main()
