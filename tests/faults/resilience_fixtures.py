"""Helpers for the serving-resilience fault tests: a small repository, steady mixed load, leak checks.

``MixedLoad`` runs callers over HTTP and gRPC against several models; every request becomes one
``Outcome`` (protocol, model, send/receive time, "ok" or the exact error text), so a test can say which
requests failed, when, and with what, and compare the client's count of successes with the server's.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from client.infer import make_inputs
from exporters.pipeline_build import build_pipelines
from exporters.repository import build_repository
from exporters.spec import parse_spec
from server.stubs import Stub, server_stubs

PIPELINE = "recommender_pipeline"
EMBEDDING = f"{PIPELINE}_embedding"


def build_small_repository(spec_data: dict[str, Any], path: Path, pipeline: bool = True) -> Path:
    """``trivial`` (+ ``recommender_pipeline`` and the ``recommender`` it splits) from ``models.yaml``."""
    data = copy.deepcopy(spec_data)
    keep = ("trivial", "recommender") if pipeline else ("trivial",)
    data["models"] = [m for m in data["models"] if m["name"] in keep]
    data["pipelines"] = [p for p in data.get("pipelines", []) if pipeline and p["name"] == PIPELINE]
    spec = parse_spec(data)
    build_repository(spec, path, num_gpus=0)
    if pipeline:
        build_pipelines(spec, path, num_gpus=0)
    return path


def request_arrays(model: str) -> dict[str, np.ndarray]:
    """One fixed, valid request per model (the same every time, so answers can be compared)."""
    if model == "trivial":
        return {"x": np.linspace(-1, 1, 16, dtype=np.float32).reshape(1, 16)}
    rng = np.random.default_rng(3)
    return {
        "dense": rng.standard_normal((1, 13)).astype(np.float32),
        "sparse_ids": np.array([[0, 3, 6, 1, 2, 3, 4, 5]], dtype=np.int64),
    }


OUTPUT = {"trivial": "y", PIPELINE: "probability", "recommender": "probability"}


def infer_once(client: Any, protocol: str, model: str) -> np.ndarray:
    module = httpclient if protocol == "http" else grpcclient
    result = client.infer(model, make_inputs(module, request_arrays(model)))
    return result.as_numpy(OUTPUT[model])


@dataclass(frozen=True)
class Outcome:
    protocol: str
    model: str
    sent: float
    received: float
    error: str  # "" for success


class MixedLoad:
    """Closed-loop callers (one connection each) over both protocols until ``stop()``; bounded in time."""

    def __init__(self, http_url: str, grpc_url: str, models: list[str], callers_per: int = 1) -> None:
        self.urls = {"http": http_url, "grpc": grpc_url}
        self.outcomes: list[Outcome] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._loop, args=(protocol, model), daemon=True)
            for protocol in ("http", "grpc")
            for model in models
            for _ in range(callers_per)
        ]

    def _loop(self, protocol: str, model: str) -> None:
        module = httpclient if protocol == "http" else grpcclient
        client = module.InferenceServerClient(self.urls[protocol])
        deadline = time.monotonic() + 300  # bounded even if a test forgets to stop it
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

    def start(self) -> MixedLoad:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)

    def hung(self) -> int:
        """Callers still waiting for an answer after ``stop()``: requests that never came back."""
        return sum(thread.is_alive() for thread in self._threads)

    def wait_for(self, count: int, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.ok()) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(self.ok()) >= count, f"load got {len(self.ok())} answers, wanted {count}"

    def ok(self, where: Callable[[Outcome], bool] = lambda o: True) -> list[Outcome]:
        with self._lock:
            return [o for o in self.outcomes if not o.error and where(o)]

    def failed(self, where: Callable[[Outcome], bool] = lambda o: True) -> list[Outcome]:
        with self._lock:
            return [o for o in self.outcomes if o.error and where(o)]


def server_success_count(http_url: str, model: str) -> int:
    """Successful inferences of ``model`` (all versions) as the server counts them."""
    stats = httpclient.InferenceServerClient(http_url).get_inference_statistics(model)
    return sum(int(s["inference_stats"]["success"]["count"]) for s in stats["model_stats"])


def shm_regions(prefix: str) -> list[str]:
    return sorted(p.name for p in Path("/dev/shm").glob(f"{prefix}*"))


def stub_of(server_pid: int, model: str) -> Stub:
    """``model``'s live stub in one server."""
    for stub in server_stubs(server_pid):
        if stub.alive and stub.model == model:
            return stub
    raise AssertionError(f"no live stub for {model}")
