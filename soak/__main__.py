"""``make soak``: mixed load for minutes with faults injected at random; nothing lost, nothing leaked.

One supervised server with both fronts, as ``make serve`` runs it, under HTTP and gRPC callers: the
invariant fuzz (fault matrix row 62) for ``--invariant-s``, then a fault of ``soak.faults`` or
``soak.attacks`` every few seconds, then a drain under load. Exit 0 only if nothing was lost or leaked,
the server never died but by the soak's hand, and it exited as expected at the drain."""

from __future__ import annotations

import argparse
import logging
import random
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import tritonclient.http as httpclient

from server.launcher import ServerOptions, TritonServer
from server.ports import add_port_base_option, use_port_base
from server.stubs import stubs_with_prefix
from server.supervisor import Supervisor
from soak.attacks import ATTACKS
from soak.faults import FAULTS, Soak, recover
from soak.invariant_fuzz import rss_mib, run_for
from soak.mixed_load import PIPELINE, MixedLoad
from soak.report import SoakReport, account, close_by_restarts, own_restarts, record_exit

log = logging.getLogger("soak")  # not __name__: run as ``python -m soak`` that is "__main__"
LOAD_MODELS = ("trivial", "recommender", PIPELINE)
HEAL_WAIT_S = 15  # let the last fault heal before the final drain
ALL_FAULTS = {**FAULTS, **ATTACKS}


def run_soak(
    repository: Path,
    duration_s: float,
    seed: int = 0,
    fault_every_s: float = 20.0,
    fuzz_cases: int = 100,
    invariant_s: float | None = None,
) -> SoakReport:
    """Mixed load on ``repository``: ``invariant_s`` (default half of ``duration_s``) of the invariant
    fuzz, then ``duration_s`` with a random fault every ~``fault_every_s``."""
    rng = random.Random(seed)
    report = SoakReport(duration_s)
    logs = Path(tempfile.mkdtemp(prefix="soak-"))  # outside the server's folder: read after its stop
    options = ServerOptions(
        repository=repository, exit_timeout_s=5, port_wait_s=10, log_path=logs / "server.log",
        http_front=True, grpc_front=True,  # as `make serve` runs it: the fronts face the faults
    )  # fmt: skip
    server = TritonServer(options)
    # supervised as make serve is: a server that dies anyway is restarted, and the report says so
    supervisor = Supervisor(server, record_path=None)
    supervisor.start()
    supervising = threading.Thread(target=supervisor.run, name="supervisor", daemon=True)
    supervising.start()
    try:
        names = {p.name for p in repository.iterdir() if (p / "config.pbtxt").exists()}
        models = [m for m in LOAD_MODELS if m in names]
        # which stub-backed models each loaded model depends on (an ensemble fails when a stage dies)
        served_by = {m: {m} | {n for n in names if m == PIPELINE and n.startswith(f"{m}_")} for m in models}
        fuzz_s = duration_s / 2 if invariant_s is None else invariant_s
        load = MixedLoad(server.http_url, server.grpc_url, models, max_s=fuzz_s + duration_s + 120).start()
        client = httpclient.InferenceServerClient(server.http_url)
        soak = Soak(server, client, rng, report, models, sorted(set().union(*served_by.values())), fuzz_cases)
        soak.fuzz_models = [m for m in (*models, "text_embedding") if m in names]
        soak.supervisor = supervisor
        load.wait_for(20)
        # the three invariants under load and no fault (soak.invariant_fuzz): a fault is meant to move
        # the PIDs invariant (c) holds still
        log.info("the invariant fuzz under load for %.0f s, then %.0f s of faults", fuzz_s, duration_s)
        report.invariants = run_for(server, fuzz_s, first_seed=seed) if fuzz_s > 0 else None
        report.rss_start_mib = rss_mib(server.pid or 0)
        report.server_pids.append(server.pid or 0)
        end = time.monotonic() + duration_s
        pending: list[str] = []
        while time.monotonic() < end:
            time.sleep(min(rng.uniform(0.5, 1.5) * fault_every_s, max(0.0, end - time.monotonic())))
            if time.monotonic() >= end:
                break
            if not pending:  # each kind once per round, in random order
                pending = rng.sample(sorted(ALL_FAULTS), len(ALL_FAULTS))
            fault = pending.pop()
            log.info("fault %s (%.0f s of faults left)", fault, end - time.monotonic())
            ALL_FAULTS[fault](soak)
            if server.pid and server.pid != report.server_pids[-1]:
                report.server_pids.append(server.pid)
        log.info("faults done: %d s for the last to heal, then the drain under load", HEAL_WAIT_S)
        time.sleep(HEAL_WAIT_S)
        recover(soak)
        supervisor.release()
        supervising.join(timeout=120)
        own_restarts(report, supervisor.record.history)
        close_by_restarts(report.outages)
        report.rss_end_mib = rss_mib(server.pid or 0)
        drain_at = time.monotonic()
        server.stop()
        load.stop()
        record_exit(report, server)
        waiting = [caller.name for caller in load.callers if caller.is_alive()]
        account(report, load.outcomes, (drain_at, server.drain_finished_at), served_by, waiting)
    finally:
        supervisor.release()
        server.stop()
        shutil.rmtree(logs, ignore_errors=True)
    report.leaked_stubs = stubs_with_prefix(server.shm_prefix)
    report.leaked_regions = sorted(p.name for p in Path("/dev/shm").glob(f"{server.shm_prefix}*"))
    return report


def main(argv: list[str] | None = None, run: Callable[..., SoakReport] = run_soak) -> int:
    """``make soak``; ``run``: the soak itself (a test hands in one that starts nothing)."""
    parser = argparse.ArgumentParser(
        prog="python -m soak", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of load (default 600)")
    parser.add_argument("--fault-every", type=float, default=20.0, help="mean seconds between faults")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fuzz-cases", type=int, default=100, help="mutated HTTP requests per fuzz burst")
    parser.add_argument(
        "--invariant-s",
        type=float,
        help="seconds of the invariant fuzz first (default: half of --duration; 0: none)",
    )
    add_port_base_option(parser)
    args = parser.parse_args(argv)
    use_port_base(args.port_base)  # the soak's server (server.ports)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    report = run(
        args.repository, args.duration, args.seed, args.fault_every, args.fuzz_cases, args.invariant_s
    )
    print(report.text())
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
