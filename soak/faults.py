"""``make soak``'s faults: one small function per fault, registered in ``FAULTS``.

Each fault gets the ``Soak`` it runs in (server, an HTTP client, the seeded random source, the
report) and records what it did: a fault that must get one exact answer records it in a ``Check``;
a fault that takes a model out of service records an ``Outage`` (the accounting then excuses that
model's failures inside the outage, and only those). Adding a fault is one function and one entry in
``FAULTS``; ``recover`` fills in, at the end, when each outage ended.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from client.infer import make_inputs
from exporters.pipeline_live import embedding_update
from server.launcher import TritonServer
from server.stubs import server_stubs
from soak.mixed_load import PIPELINE
from soak.report import Outage, SoakReport

log = logging.getLogger(__name__)
BAD_DTYPE = "inference input 'x' data-type is 'FP64', but model 'trivial' expects 'FP32'"
# Triton's answer for a model whose stub is gone: "Stub process ... is not healthy"
DEAD_STUB = "is not healthy"


@dataclass
class Soak:
    """What a fault may touch: the server, a client for it, the seeded random source, the report."""

    server: TritonServer
    client: httpclient.InferenceServerClient
    rng: random.Random
    report: SoakReport
    models: list[str]  # the models under load
    stub_models: list[str]  # the Python-backend models they depend on: what stub faults may hit


def kill_stub(soak: Soak) -> None:
    """SIGKILL one live stub: the watchdog must reload its model; failures say the stub is unhealthy."""
    stubs = [s for s in server_stubs(soak.server.pid or 0) if s.alive and s.model in soak.stub_models]
    if not stubs:
        return
    victim = soak.rng.choice(stubs)
    os.kill(victim.pid, signal.SIGKILL)
    soak.report.outages.append(Outage("stub killed", victim.model, time.monotonic(), time.time(), DEAD_STUB))
    log.info("killed a stub of %s", victim.model)


def bad_request(soak: Soak) -> None:
    """A wrong-dtype request to ``trivial``: it must get exactly the 400 the README promises."""
    try:
        soak.client.infer("trivial", make_inputs(httpclient, {"x": np.zeros((1, 16), np.float64)}))
        right = False
    except InferenceServerException as error:
        right = error.status() == "400" and BAD_DTYPE in error.message()
    soak.report.check("malformed requests (exact 400)").record(right)


def update_embedding(soak: Soak) -> None:
    """An embedding row update through the pipeline's embedding stage: it must be acknowledged."""
    if PIPELINE not in soak.models:
        return
    config = soak.client.get_model_config(f"{PIPELINE}_embedding")
    width = next(int(i["dims"][-1]) for i in config["input"] if i["name"] == "update_values")
    rows = np.array([soak.rng.randrange(0, 8) for _ in range(4)])
    values = np.full((len(rows), width), soak.rng.uniform(-1, 1), np.float32)
    update = embedding_update(soak.rng.randrange(0, 2), rows, values)
    try:
        soak.client.infer(f"{PIPELINE}_embedding", make_inputs(httpclient, update))
        acknowledged = True
    except InferenceServerException as error:
        log.error("embedding update refused: %s", error)
        acknowledged = False
    soak.report.check("embedding updates (acknowledged)").record(acknowledged)


FAULTS: dict[str, Callable[[Soak], None]] = {
    "kill": kill_stub,
    "bad": bad_request,
    "update": update_embedding,
}


def recover(soak: Soak) -> None:
    """Each killed stub's reload time, from the watchdog's record (epoch seconds, mapped to monotonic)."""
    watchdog = soak.server.watchdog
    if watchdog is None:
        return
    offset = time.monotonic() - time.time()
    for outage in soak.report.outages:
        for event in watchdog.state.events:
            if event.model == outage.model and event.detected_at >= outage.epoch - 1 and event.healed_at:
                outage.recovered_at = event.healed_at + offset
                break
