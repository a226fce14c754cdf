"""``make soak``'s faults: one small function per fault, registered in ``FAULTS``.

Each fault gets the ``Soak`` it runs in (server, an HTTP client, the seeded random source, the
report) and records what it did: a fault that must get one exact answer records it in a ``Check``;
a fault that takes a model out of service records an ``Outage`` (the accounting then excuses that
model's failures inside the outage, and only those). Adding a fault is one function and one entry in
``FAULTS``; ``recover`` fills in, at the end, when each outage ended.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from client.infer import make_inputs
from exporters.pipeline_live import embedding_update
from server.launcher import TritonServer
from server.stubs import Stub, server_stubs
from soak.mixed_load import PIPELINE
from soak.report import Outage, SoakReport

log = logging.getLogger(__name__)
BAD_DTYPE = "inference input 'x' data-type is 'FP64', but model 'trivial' expects 'FP32'"
# Triton's answer for a model whose stub is gone or hung: "Stub process ... is not healthy"
DEAD_STUB = "is not healthy"
UPDATE_RETRY_S = 60.0  # an update refused by a stage another fault has down is retried this long
RESUME_AFTER_S = (2.0, 6.0)  # a stopped stub is resumed this long after (or never, half the time)


@dataclass
class Soak:
    """What a fault may touch: the server, a client for it, the seeded random source, the report."""

    server: TritonServer
    client: httpclient.InferenceServerClient
    rng: random.Random
    report: SoakReport
    models: list[str]  # the models under load
    stub_models: list[str]  # the Python-backend models they depend on: what stub faults may hit


def _serving_stub(soak: Soak) -> Stub | None:
    """A random live stub of a model under load (never a config auto-complete stub)."""
    stubs = [
        s
        for s in server_stubs(soak.server.pid or 0)
        if s.alive and s.model in soak.stub_models and s.instance != s.model
    ]
    return soak.rng.choice(stubs) if stubs else None


def kill_stub(soak: Soak) -> None:
    """SIGKILL one live stub: the watchdog must reload its model; failures say the stub is unhealthy."""
    victim = _serving_stub(soak)
    if victim is None:
        return
    os.kill(victim.pid, signal.SIGKILL)
    soak.report.outages.append(Outage("stub killed", victim.model, time.monotonic(), time.time(), DEAD_STUB))
    log.info("killed a stub of %s", victim.model)


def stop_stub(soak: Soak) -> None:
    """SIGSTOP one live stub, and SIGCONT it a few seconds later as an unlucky operator would (or never):
    the watchdog must see it hung, kill it before it resumes and reload its model (Triton 2.51 aborts
    when a stopped stub resumes). Failures say the stub is unhealthy."""
    victim = _serving_stub(soak)
    if victim is None:
        return
    os.kill(victim.pid, signal.SIGSTOP)
    soak.report.outages.append(Outage("stub stopped", victim.model, time.monotonic(), time.time(), DEAD_STUB))
    resume = soak.rng.choice([None, soak.rng.uniform(*RESUME_AFTER_S)])
    if resume is not None:
        threading.Timer(resume, _resume, args=(victim.pid,)).start()
    then = f"resuming it in {resume:.1f} s" if resume is not None else "never resuming it"
    log.info("stopped a stub of %s; %s", victim.model, then)


def _resume(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # the watchdog has killed it: as it should
        os.kill(pid, signal.SIGCONT)


def bad_request(soak: Soak) -> None:
    """A wrong-dtype request to ``trivial``: it must get exactly the 400 the README promises."""
    try:
        soak.client.infer("trivial", make_inputs(httpclient, {"x": np.zeros((1, 16), np.float64)}))
        right = False
    except InferenceServerException as error:
        right = error.status() == "400" and BAD_DTYPE in error.message()
    soak.report.check("malformed requests (exact 400)").record(right)


def update_embedding(soak: Soak) -> None:
    """An embedding row update through the pipeline's embedding stage: it must be acknowledged. Sent
    while another fault has the stage down, it is refused as unhealthy and retried, as a client would
    (updates overwrite rows, so a retry is harmless), for up to ``UPDATE_RETRY_S``."""
    if PIPELINE not in soak.models:
        return
    config = soak.client.get_model_config(f"{PIPELINE}_embedding")
    width = next(int(i["dims"][-1]) for i in config["input"] if i["name"] == "update_values")
    rows = np.array([soak.rng.randrange(0, 8) for _ in range(4)])
    values = np.full((len(rows), width), soak.rng.uniform(-1, 1), np.float32)
    update = embedding_update(soak.rng.randrange(0, 2), rows, values)
    deadline = time.monotonic() + UPDATE_RETRY_S
    while True:
        try:
            soak.client.infer(f"{PIPELINE}_embedding", make_inputs(httpclient, update))
            acknowledged = True
            break
        except InferenceServerException as error:
            if DEAD_STUB in error.message() and time.monotonic() < deadline:
                time.sleep(0.5)
                continue
            log.error("embedding update refused: %s", error)
            acknowledged = False
            break
    soak.report.check("embedding updates (acknowledged)").record(acknowledged)


FAULTS: dict[str, Callable[[Soak], None]] = {
    "kill": kill_stub,
    "stop": stop_stub,
    "bad": bad_request,
    "update": update_embedding,
}


def recover(soak: Soak) -> None:
    """When the watchdog saw each killed or stopped stub and when it had reloaded the model, from its
    record (epoch seconds, mapped to monotonic): the first event of that model after the fault."""
    watchdog = soak.server.watchdog
    if watchdog is None:
        return
    offset = time.monotonic() - time.time()
    claimed: set[int] = set()
    for outage in sorted(soak.report.outages, key=lambda o: o.at):
        for number, event in enumerate(watchdog.state.events):
            if number in claimed or event.model != outage.model or event.detected_at < outage.epoch - 1:
                continue
            claimed.add(number)
            outage.detected_at = event.detected_at + offset
            if event.healed_at:
                outage.recovered_at = event.healed_at + offset
            break
