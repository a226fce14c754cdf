"""Try to reproduce Triton 2.51's abort after the watchdog kills a stopped stub (docs/SERVING.md, fault
matrix row 25): under load, SIGSTOP the pipeline's embedding stub again and again (``--holding S``: when
it owns a pool mutex), and count the times tritonserver did not survive its kill and reload, apart for
stops owning a mutex. What to expect: no abort."""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

import yaml

from server import TritonServer
from server.records import read_record
from server.stubs import server_stubs
from soak.mixed_load import PIPELINE, MixedLoad

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "faults"))
from resilience_fixtures import build_small_repository, explicit_options  # noqa: E402
from stub_mutex import stop_owning_a_mutex  # noqa: E402

EMBEDDING = f"{PIPELINE}_embedding"
log = logging.getLogger("stopped_stub_abort")
HEAL_WAIT_S = 90.0
SETTLE_S = 3.0  # watched after each heal: the soak's abort came 2.4 s after the kill


def embedding_stub_pid(server: TritonServer) -> int | None:
    live = [
        s for s in server_stubs(server.pid) if s.alive and s.model == EMBEDDING and s.instance != EMBEDDING
    ]
    return live[0].pid if live else None


def healed(server: TritonServer, stopped_pid: int) -> bool:
    """The stopped stub is gone, a new one serves and the watchdog marks nothing unavailable."""
    if any(s.pid == stopped_pid and s.alive for s in server_stubs(server.pid)):
        return False
    return embedding_stub_pid(server) is not None and not read_record(server.watchdog_path).get(
        "unavailable_now"
    )


def one_stop(server: TritonServer, holding_s: float) -> tuple[bool, float, bool]:
    """Stop the embedding stub once: (server survived, seconds to heal, it owned a mutex when stopped)."""
    stub = next(s for s in server_stubs(server.pid) if s.pid == embedding_stub_pid(server))
    pid, stopped = stub.pid, time.monotonic()
    held, attempts = stop_owning_a_mutex(pid, stub.shm_region, holding_s)
    log.info("stub %s stopped after %d stops, owning mutexes at offsets %s", pid, attempts, held)
    deadline = stopped + HEAL_WAIT_S
    while time.monotonic() < deadline and server.process.poll() is None and not healed(server, pid):
        time.sleep(0.05)
    took = time.monotonic() - stopped
    end = time.monotonic() + SETTLE_S
    while time.monotonic() < end and server.process.poll() is None:
        time.sleep(0.05)
    return server.process.poll() is None, took, bool(held)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument(
        "--holding", type=float, default=0.0, metavar="S",
        help="watch the running stub up to S seconds and stop it when it owns a mutex",
    )  # fmt: skip
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    work = Path(tempfile.mkdtemp(prefix="stopped_stub_abort-"))
    repository = build_small_repository(yaml.safe_load((ROOT / "models.yaml").read_text()), work / "repo")
    by_lock: dict[bool, list[int]] = {True: [0, 0], False: [0, 0]}  # owned a mutex -> [aborts, stops]
    server = TritonServer(explicit_options(repository, work / "server")).start()
    try:
        for iteration in range(1, args.iterations + 1):
            load = MixedLoad(server.http_url, server.grpc_url, ["trivial", PIPELINE])
            load.start().wait_for(20)
            try:
                alive, took, holding = one_stop(server, args.holding)
            finally:
                load.stop()
            by_lock[holding][1] += 1
            owned = "owning a mutex" if holding else "owning no mutex"
            if alive:
                print(f"{iteration}: stopped {owned}: survived, healed in {took:.1f} s", flush=True)
                continue
            by_lock[holding][0] += 1
            print(
                f"{iteration}: stopped {owned}: tritonserver died ({server.process.returncode}), {took:.1f} s"
            )
            print(server.log_tail(25), flush=True)
            server.reap()
            server.start()
    finally:
        server.stop()
    aborts, stops = (sum(column) for column in zip(*by_lock.values(), strict=True))
    print(f"stopped stub under load: {aborts} aborts in {stops} stops", flush=True)
    for holding, (died, stops) in by_lock.items():
        print(f"  stopped {'owning a mutex' if holding else 'owning none'}: {died} aborts in {stops}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
