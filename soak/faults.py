"""``make soak``'s faults, one function each, registered in ``FAULTS``. A fault that must get one exact
answer records a ``Check``; one that takes a model out of service records an ``Outage`` (its failures
are excused inside it, and only those); ``recover`` fills in when each outage ended."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from client.infer import make_inputs
from exporters.pipelines.live import embedding_update
from server.launcher import TritonServer
from server.stubs import Stub, server_stubs
from server.supervisor import Supervisor
from server.watchdog import HealEvent
from soak.http_fuzz import fuzz
from soak.mixed_load import PIPELINE
from soak.other_uid import grpc_call
from soak.report import SERVER_KILLED, Outage, SoakReport

log = logging.getLogger(__name__)
BAD_DTYPE = "inference input 'x' data-type is 'FP64', but model 'trivial' expects 'FP32'"
# Triton's answer for a model whose stub is gone or hung: "Stub process ... is not healthy"
DEAD_STUB = "is not healthy"
UPDATE_RETRY_S = 60.0  # an update refused by a stage another fault has down is retried this long
RESUME_AFTER_S = (2.0, 6.0)  # a stopped stub is resumed this long after (or never, half the time)
ENCODER = "text_embedding_encoder"  # the text encoder: a variable INT64 axis an overflowing shape fits
REFUSED = {"http": "403", "grpc": "StatusCode.PERMISSION_DENIED"}


@dataclass
class Soak:
    """What a fault may touch: the server, a client for it, the seeded random source, the report."""

    server: TritonServer
    client: httpclient.InferenceServerClient
    rng: random.Random
    report: SoakReport
    models: list[str]  # the models under load
    stub_models: list[str]  # the Python-backend models they depend on: what stub faults may hit
    fuzz_cases: int = 100  # mutated HTTP requests per fuzz burst
    fuzz_models: list[str] = field(default_factory=list)  # the served models the fuzzer builds requests for
    supervisor: Supervisor | None = None  # restarts the server the kill-server fault kills

    def stubs(self) -> list[Stub]:
        return [s for s in server_stubs(self.server.pid or 0) if s.alive]

    def stub_pids(self, model: str | None = None) -> set[int]:
        return {s.pid for s in self.stubs() if model is None or s.model == model}

    def stub_region(self) -> str | None:
        """The ``/dev/shm`` region of a random live stub, if any."""
        regions = [s.shm_region for s in self.stubs() if s.shm_region]
        return self.rng.choice(regions) if regions else None

    @contextlib.contextmanager
    def clients(self) -> Iterator[dict[str, Any]]:
        """A client per protocol: the soak's own over HTTP, a new one over gRPC closed with the block (left
        open, a caught error's traceback kept it until the collector closed it in whichever thread)."""
        with grpcclient.InferenceServerClient(self.server.grpc_url) as grpc_client:
            yield {"http": self.client, "grpc": grpc_client}

    def input_names(self, model: str) -> tuple[str, ...] | None:
        """``model``'s input names, or None when the repository does not serve it."""
        try:
            return tuple(i["name"] for i in self.client.get_model_metadata(model)["inputs"])
        except InferenceServerException:
            return None

    def invalid_argument(self, request: service_pb2.ModelInferRequest, says: str) -> bool:
        """Whether the gRPC front refuses ``request`` with INVALID_ARGUMENT saying ``says``."""
        with grpc.insecure_channel(self.server.grpc_url) as channel:
            code, details, _, _ = grpc_call(channel, "ModelInfer", request.SerializeToString(), 60)
        return code == "INVALID_ARGUMENT" and says in details


def registration_refused(client: Any, protocol: str, name: str, says: str = "") -> bool:
    """Whether registering ``/dev/shm/name`` is forbidden (HTTP 403, PERMISSION_DENIED), saying ``says``."""
    try:
        client.register_system_shared_memory(name, f"/{name}", 4096)
        return False
    except InferenceServerException as error:
        return error.status() == REFUSED[protocol] and says in (error.message() or "")


def _signal_stub(soak: Soak, signum: int, fault: str) -> Stub | None:
    """Signal a random stub of a model under load (never a config auto-complete stub); record the outage."""
    stubs = [s for s in soak.stubs() if s.model in soak.stub_models and s.instance != s.model]
    if not stubs:
        return None
    victim = soak.rng.choice(stubs)
    os.kill(victim.pid, signum)
    soak.report.outages.append(Outage(fault, victim.model, time.monotonic(), time.time(), DEAD_STUB))
    log.info("%s: a stub of %s", fault, victim.model)
    return victim


def kill_stub(soak: Soak) -> None:
    """SIGKILL a stub: the watchdog must reload its model."""
    _signal_stub(soak, signal.SIGKILL, "stub killed")


def stop_stub(soak: Soak) -> None:
    """SIGSTOP a stub and SIGCONT it later (or never): the watchdog must kill it first (2.51 aborts)."""
    victim = _signal_stub(soak, signal.SIGSTOP, "stub stopped")
    if victim is None:
        return
    resume = soak.rng.choice([None, soak.rng.uniform(*RESUME_AFTER_S)])
    if resume is not None:
        threading.Timer(resume, _resume, args=(victim.pid,)).start()
    log.info("stub stopped: %s", "never resumed" if resume is None else f"resumed in {resume:.1f} s")


def _resume(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # the watchdog has killed it: as it should
        os.kill(pid, signal.SIGCONT)


def bad_request(soak: Soak) -> None:
    """A wrong-dtype request to ``trivial``: exactly the 400 docs/SERVING.md promises."""
    try:
        soak.client.infer("trivial", make_inputs(httpclient, {"x": np.zeros((1, 16), np.float64)}))
        right = False
    except InferenceServerException as error:
        right = error.status() == "400" and BAD_DTYPE in error.message()
    soak.report.check("malformed requests (exact 400)").record(right)


def update_embedding(soak: Soak) -> None:
    """An embedding update must be acknowledged (retried while another fault has the stage down)."""
    if PIPELINE not in soak.models:
        return
    config = soak.client.get_model_config(f"{PIPELINE}_embedding")
    width = next(int(i["dims"][-1]) for i in config["input"] if i["name"] == "update_values")
    rows = np.array([soak.rng.randrange(0, 8) for _ in range(4)])
    values = np.full((len(rows), width), soak.rng.uniform(-1, 1), np.float32)
    update = embedding_update(soak.rng.randrange(0, 2), rows, values)
    deadline = time.monotonic() + UPDATE_RETRY_S
    acknowledged = False
    while not acknowledged:
        try:
            soak.client.infer(f"{PIPELINE}_embedding", make_inputs(httpclient, update))
            acknowledged = True
        except InferenceServerException as error:
            if DEAD_STUB not in error.message() or time.monotonic() >= deadline:
                log.error("embedding update refused: %s", error)
                break
            time.sleep(0.5)
    soak.report.check("embedding updates (acknowledged)").record(acknowledged)


def overflowing_request(
    model: str, inputs: tuple[str, ...], shape: tuple[int, ...] = (1, 2**61)
) -> service_pb2.ModelInferRequest:
    """INT64 ``shape`` for every input, no contents; ``[1, 2**61]`` Triton 2.51 alone sizes as 0 bytes."""
    request = service_pb2.ModelInferRequest(model_name=model)
    for name in inputs:
        request.inputs.add(name=name, datatype="INT64", shape=shape)
        request.raw_input_contents.append(b"")
    return request


def overflowing_grpc_shape(soak: Soak) -> None:
    """The overflowing shape over gRPC to the text encoder: INVALID_ARGUMENT, no stub lost."""
    inputs = soak.input_names(ENCODER)
    if inputs is None:
        return
    before = soak.stub_pids(ENCODER)
    right = soak.invalid_argument(overflowing_request(ENCODER, inputs), "declares shape")
    alive = before <= soak.stub_pids(ENCODER)
    soak.report.check("overflowing gRPC shapes (INVALID_ARGUMENT, no stub lost)").record(right and alive)


def shared_memory_probe(soak: Soak) -> None:
    """A client registers a stub's IPC region over both protocols: refused, and not listed."""
    region = soak.stub_region()
    if region is None:
        return
    with soak.clients() as clients:
        # a list, not a generator: both protocols are probed even when the first is not refused
        refusals = [registration_refused(client, protocol, region) for protocol, client in clients.items()]
    status = soak.client.get_system_shared_memory_status()
    registered = [r for r in status if r.get("name") == region or r.get("key") == f"/{region}"]
    soak.report.check("shared-memory probes (refused)").record(all(refusals) and not registered)


def fuzz_burst(soak: Soak) -> None:
    """``soak.fuzz_cases`` cases of ``soak.http_fuzz``: each answered below 500, the server live after."""
    if not soak.fuzz_cases:
        return
    seed = soak.rng.randrange(1 << 31)
    models = soak.fuzz_models or soak.models
    report = fuzz(soak.server.http_url, models, soak.fuzz_cases, seed, after_each=lambda: _liveness(soak))
    for finding in report.findings:
        log.error("http fuzz: %s", finding)
    check = soak.report.check("http fuzz cases (answered below 500, server live)")
    targets = soak.report.check("  of which request-target mutations (fault matrix rows 35-36)")
    failed = {finding.split(":", 1)[0] for finding in report.findings}
    for number in range(report.cases):
        check.record(f"case {number}" not in failed)
        if number in report.target_cases:
            targets.record(f"case {number}" not in failed)
    log.info("%s", report.text().splitlines()[0])


def _liveness(soak: Soak) -> list[str]:
    try:
        return [] if soak.client.is_server_live() else ["server not live"]
    except InferenceServerException as error:
        return [f"server not live: {error}"]


FAULTS: dict[str, Callable[[Soak], None]] = {
    "kill": kill_stub,
    "stop": stop_stub,
    "bad": bad_request,
    "update": update_embedding,
    "shm": shared_memory_probe,
    "overflow": overflowing_grpc_shape,
    "fuzz": fuzz_burst,
}


def recover(soak: Soak) -> None:
    """When the watchdog saw each stub outage and when the model served again, from its record."""
    watchdog = soak.server.watchdog
    if watchdog is not None:
        match_heal_events(soak.report.outages, watchdog.state.events, time.monotonic() - time.time())


def match_heal_events(outages: list[Outage], events: list[HealEvent], offset: float) -> None:
    """Each outage gets its model's first unclaimed event after the fault, and recovers at the first heal
    from then on (a fault on a reloading model can make that reload fail)."""
    claimed: set[int] = set()
    for outage in sorted(outages, key=lambda o: o.at):
        if outage.fault == SERVER_KILLED:  # recovered when the supervisor served again, not a reload
            continue
        for number, event in enumerate(events):
            if number in claimed or event.model != outage.model or event.detected_at < outage.epoch - 1:
                continue
            claimed.add(number)
            outage.detected_at = event.detected_at + offset
            healed = [e.healed_at for e in events[number:] if e.model == outage.model and e.healed_at]
            if healed:
                outage.recovered_at = healed[0] + offset
            break
