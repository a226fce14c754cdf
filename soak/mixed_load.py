"""Steady mixed load for the fault tests and ``make soak``: closed-loop callers over HTTP and gRPC, each
request one ``Outcome`` with its exact error, and each model one fixed valid request so answers compare."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from client.connection import connect, protocol_module
from client.infer import make_inputs

PIPELINE = "recommender_pipeline"
# What a request sent during a drain may get instead of an answer: "not served here", never "dropped".
CLEAN_REFUSALS = (
    "Request for unknown model",  # unloaded by the drain: HTTP 404 / gRPC NOT_FOUND
    "failed to connect to all addresses",  # gRPC, once the server has exited
    "Connection refused",
    "connection closed",  # HTTP keep-alive connection closed by the exiting server, between requests
)
# A call open when 2.51's gRPC frontend shuts down is CANCELLED: clean only if sent after the drain had
# unloaded every model (nothing it asked for can have run).
CANCELLED_AT_EXIT = "StatusCode.CANCELLED"


def request_arrays(model: str) -> dict[str, np.ndarray]:
    """One fixed, valid request per model, the same every time, so answers can be compared."""
    if model == "trivial":
        return {"x": np.linspace(-1, 1, 16, dtype=np.float32).reshape(1, 16)}
    rng = np.random.default_rng(3)
    return {
        "dense": rng.standard_normal((1, 13)).astype(np.float32),
        "sparse_ids": np.array([[0, 3, 6, 1, 2, 3, 4, 5]], dtype=np.int64),
    }


OUTPUT = {"trivial": "y", PIPELINE: "probability", "recommender": "probability"}


def infer_once(client: Any, protocol: str, model: str) -> np.ndarray:
    result = client.infer(model, make_inputs(protocol_module(protocol), request_arrays(model)))
    return result.as_numpy(OUTPUT[model])


@dataclass(frozen=True)
class Outcome:
    protocol: str
    model: str
    sent: float
    received: float
    error: str  # "" for success


def refused_cleanly(outcome: Outcome, drain_finished_at: float | None) -> bool:
    """Whether a request that failed during a drain was refused without being taken in."""
    if any(refusal in outcome.error for refusal in CLEAN_REFUSALS):
        return True
    after_drain = drain_finished_at is not None and outcome.sent >= drain_finished_at
    return after_drain and CANCELLED_AT_EXIT in outcome.error


class MixedLoad:
    """Closed-loop callers (one connection each) over both protocols until ``stop()``; bounded in time."""

    def __init__(
        self, http_url: str, grpc_url: str, models: list[str], callers_per: int = 1, max_s: float = 300
    ) -> None:
        self.max_s = max_s
        self.urls = {"http": http_url, "grpc": grpc_url}
        self.outcomes: list[Outcome] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.callers = [  # one thread each; one alive after ``stop()`` waits on a request never answered
            threading.Thread(
                target=self._loop, args=(protocol, model), name=f"{protocol} {model}", daemon=True
            )
            for protocol in ("http", "grpc")
            for model in models
            for _ in range(callers_per)
        ]

    def _loop(self, protocol: str, model: str) -> None:
        client = connect(protocol, self.urls[protocol])
        deadline = time.monotonic() + self.max_s  # bounded even if the caller forgets to stop it
        while not self._stop.is_set() and time.monotonic() < deadline:
            sent = time.monotonic()
            try:
                infer_once(client, protocol, model)
                error = ""
            except Exception as failure:  # every failure is recorded with its text; tests assert on them
                error = str(failure)
            with self._lock:
                self.outcomes.append(Outcome(protocol, model, sent, time.monotonic(), error))
            if error:
                time.sleep(0.02)
        client.close()  # in this thread: the gevent pool cannot be joined from the collector's

    def start(self) -> MixedLoad:
        for caller in self.callers:
            caller.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for caller in self.callers:
            caller.join(timeout=30)

    def wait_for(
        self, count: int, timeout_s: float = 60, where: Callable[[Outcome], bool] = lambda o: True
    ) -> None:
        """Until ``count`` answers (of those ``where`` picks) were good, ``timeout_s`` at most."""
        deadline = time.monotonic() + timeout_s
        while len(self.ok(where)) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(self.ok(where)) >= count, f"load got {len(self.ok(where))} answers, wanted {count}"

    def ok(self, where: Callable[[Outcome], bool] = lambda o: True) -> list[Outcome]:
        with self._lock:
            return [o for o in self.outcomes if not o.error and where(o)]
