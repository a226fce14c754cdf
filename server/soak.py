"""``make soak``: mixed load for minutes with faults injected at random; nothing lost, nothing leaked.

One server on the built repository (free ports, like the tests). Callers over HTTP and gRPC send
``trivial``, ``recommender`` and ``recommender_pipeline`` back to back; every few seconds (at random,
seeded) one fault is injected: a Python-backend stub killed with SIGKILL, a malformed request (wrong
dtype), or an embedding row update. At the end the server is drained and stopped under load.

Accounting: a failed request is *excused* only if it names the dead stub ("... is not healthy") and was
sent between that kill and the watchdog's reload of the model (+1 s); any other failure of a request
sent before the drain is *lost*. Malformed requests must each get the exact 400; updates must each be
acknowledged. Leaks: stubs or ``/dev/shm`` regions left after the stop, and the server's resident memory
at the start vs the end. Exit status 0 only if nothing was lost or leaked.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from client.infer import make_inputs
from exporters.pipeline_live import embedding_update
from server.launcher import ServerOptions, TritonServer
from server.mixed_load import PIPELINE, MixedLoad, Outcome, refused_cleanly
from server.stubs import server_stubs, stubs_with_prefix

log = logging.getLogger("soak")
LOAD_MODELS = ("trivial", "recommender", PIPELINE)
FAULTS = ("kill", "bad", "update")
BAD_DTYPE = "inference input 'x' data-type is 'FP64', but model 'trivial' expects 'FP32'"


@dataclass
class Kill:
    model: str
    at: float  # time.monotonic(), like the load's outcomes
    epoch: float  # time.time(), like the watchdog's record
    healed_at: float | None = None  # monotonic


@dataclass
class SoakReport:
    duration_s: float
    sent: int = 0
    ok: int = 0
    answered_during_drain: int = 0
    excused: int = 0
    lost: list[str] = field(default_factory=list)
    refused_after_drain: int = 0
    kills: list[Kill] = field(default_factory=list)
    bad_requests: int = 0
    bad_answered_right: int = 0
    updates: int = 0
    updates_acknowledged: int = 0
    rss_start_mib: float = 0.0
    rss_end_mib: float = 0.0
    leaked_stubs: list[int] = field(default_factory=list)
    leaked_regions: list[str] = field(default_factory=list)
    exit_code: int | None = None

    @property
    def passed(self) -> bool:
        healed = all(k.healed_at is not None for k in self.kills)
        return (
            not self.lost
            and healed
            and self.bad_answered_right == self.bad_requests
            and self.updates_acknowledged == self.updates
            and not self.leaked_stubs
            and not self.leaked_regions
        )

    def text(self) -> str:
        recoveries = [k.healed_at - k.at for k in self.kills if k.healed_at is not None]
        worst = f"{max(recoveries):.1f} s" if recoveries else "n/a"
        lost = f"{len(self.lost)}" + (f" (first: {self.lost[0]})" if self.lost else "")
        return "\n".join(
            [
                f"soak {self.duration_s:.0f} s: {'PASSED' if self.passed else 'FAILED'}",
                f"  requests sent before the drain: {self.sent}; ok {self.ok}; "
                f"failed while a killed stub was reloading {self.excused}; lost {lost}",
                f"  sent during the final drain: answered {self.answered_during_drain}, "
                f"refused cleanly {self.refused_after_drain}",
                f"  stubs killed: {len(self.kills)} ({Counter(k.model for k in self.kills)}); "
                f"all reloaded: {all(k.healed_at for k in self.kills)}; slowest kill-to-reloaded {worst}",
                f"  malformed requests: {self.bad_requests}, "
                f"answered with the exact 400: {self.bad_answered_right}",
                f"  embedding updates: {self.updates}, acknowledged: {self.updates_acknowledged}",
                f"  server RSS: {self.rss_start_mib:.0f} MiB at start, {self.rss_end_mib:.0f} MiB at the end",
                f"  after stop: stubs left {self.leaked_stubs}, /dev/shm regions left {self.leaked_regions}, "
                f"server exit code {self.exit_code}",
            ]
        )


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _bad_request(client: httpclient.InferenceServerClient) -> bool:
    """A wrong-dtype request to ``trivial``: True if it got exactly the 400 the README promises."""
    try:
        client.infer("trivial", make_inputs(httpclient, {"x": np.zeros((1, 16), np.float64)}))
    except InferenceServerException as error:
        return error.status() == "400" and BAD_DTYPE in error.message()
    return False


def _update(client: httpclient.InferenceServerClient, rng: random.Random) -> bool:
    config = client.get_model_config(f"{PIPELINE}_embedding")
    width = next(int(i["dims"][-1]) for i in config["input"] if i["name"] == "update_values")
    rows = np.array([rng.randrange(0, 8) for _ in range(4)])
    values = np.full((len(rows), width), rng.uniform(-1, 1), np.float32)
    update = embedding_update(rng.randrange(0, 2), rows, values)
    client.infer(f"{PIPELINE}_embedding", make_inputs(httpclient, update))
    return True


def _kill_one(server: TritonServer, models: list[str], rng: random.Random) -> Kill | None:
    stubs = [s for s in server_stubs(server.pid or 0) if s.alive and s.model in models]
    if not stubs:
        return None
    victim = rng.choice(stubs)
    os.kill(victim.pid, signal.SIGKILL)
    return Kill(victim.model, time.monotonic(), time.time())


def _heal_times(report: SoakReport, server: TritonServer) -> None:
    """Each kill's reload time, from the watchdog's record (epoch seconds, mapped to monotonic)."""
    if server.watchdog is None:
        return
    offset = time.monotonic() - time.time()
    for kill in report.kills:
        for event in server.watchdog.state.events:
            if event.model == kill.model and event.died_at >= kill.epoch - 1 and event.healed_at:
                kill.healed_at = event.healed_at + offset
                break


def _account(
    report: SoakReport,
    outcomes: list[Outcome],
    drain: tuple[float, float | None],
    served_by: dict[str, set[str]],
) -> None:
    """Sort every request into ok / excused / lost / refused after the drain (``drain``: when it
    started, and when it had unloaded every model)."""
    drain_at, drain_finished_at = drain
    for outcome in outcomes:
        if outcome.sent >= drain_at:
            if outcome.error and not refused_cleanly(outcome, drain_finished_at):
                where = f"{outcome.protocol} {outcome.model} during the drain"
                report.lost.append(f"{where}: {outcome.error[:200]}")
            report.refused_after_drain += bool(outcome.error)
            report.answered_during_drain += not outcome.error
            continue
        report.sent += 1
        if not outcome.error:
            report.ok += 1
            continue
        windows = [
            k
            for k in report.kills
            if k.model in served_by[outcome.model]
            and k.at - 0.1 <= outcome.sent <= (k.healed_at or float("inf")) + 1.0
        ]
        if windows and "is not healthy" in outcome.error:
            report.excused += 1
        else:
            report.lost.append(f"{outcome.protocol} {outcome.model}: {outcome.error[:200]}")


def run_soak(repository: Path, duration_s: float, seed: int = 0, fault_every_s: float = 20.0) -> SoakReport:
    rng = random.Random(seed)
    report = SoakReport(duration_s)
    options = ServerOptions(repository=repository, model_control_mode="explicit", exit_timeout_s=5)
    server = TritonServer(options).start()
    try:
        names = {p.name for p in repository.iterdir() if (p / "config.pbtxt").exists()}
        models = [m for m in LOAD_MODELS if m in names]
        # which stub-backed models each loaded model depends on (an ensemble fails when a stage dies)
        served_by = {m: {m} | {n for n in names if m == PIPELINE and n.startswith(f"{m}_")} for m in models}
        load = MixedLoad(server.http_url, server.grpc_url, models, max_s=duration_s + 120).start()
        client = httpclient.InferenceServerClient(server.http_url)
        load.wait_for(20)
        report.rss_start_mib = _rss_mib(server.pid or 0)
        end = time.monotonic() + duration_s
        faults: list[str] = []
        while time.monotonic() < end:
            time.sleep(min(rng.uniform(0.5, 1.5) * fault_every_s, max(0.0, end - time.monotonic())))
            if time.monotonic() >= end:
                break
            if not faults:  # each kind once per round, in random order
                faults = rng.sample(FAULTS, len(FAULTS))
            fault = faults.pop()
            if fault == "kill":
                kill = _kill_one(server, sorted(set().union(*served_by.values())), rng)
                if kill:
                    report.kills.append(kill)
                    log.info("killed a stub of %s", kill.model)
            elif fault == "bad":
                report.bad_requests += 1
                report.bad_answered_right += _bad_request(client)
            elif PIPELINE in models:
                report.updates += 1
                report.updates_acknowledged += _update(client, rng)
        time.sleep(15)  # let the last fault heal before the final drain
        _heal_times(report, server)
        report.rss_end_mib = _rss_mib(server.pid or 0)
        drain_at = time.monotonic()
        server.stop()
        load.stop()
        report.exit_code = server.process.returncode if server.process else None
        _account(report, load.outcomes, (drain_at, server.drain_finished_at), served_by)
    finally:
        server.stop()
    report.leaked_stubs = stubs_with_prefix(server.shm_prefix)
    report.leaked_regions = sorted(p.name for p in Path("/dev/shm").glob(f"{server.shm_prefix}*"))
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m server.soak", description=__doc__)
    parser.add_argument("--repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of load (default 600)")
    parser.add_argument("--fault-every", type=float, default=20.0, help="mean seconds between faults")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    report = run_soak(args.repository, args.duration, args.seed, args.fault_every)
    print(report.text())
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
