"""One tritonserver for the whole check, every model loaded at the start and no watchdog: a stub that dies
is a finding. A model that fails to load fails only the studies that need it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from client.infer import make_inputs, timed_calls
from client.stats import ModelStats, model_stats
from server import ServerOptions, TritonServer
from server.stubs import server_stubs

CUDA_POOL_BYTES = 1 << 30  # per GPU: batches of 256 images are 12 MiB each way, many in flight


class ServingError(RuntimeError):
    """A model would not load, unload or answer; the message names it."""


class Session:
    """``with Session(repository, on_gpu, workdir) as session``: the server up, every model loaded."""

    def __init__(self, repository: Path, on_gpu: bool, workdir: Path) -> None:
        extra = [f"--cuda-memory-pool-byte-size=0:{CUDA_POOL_BYTES}"] if on_gpu else []
        options = ServerOptions(
            repository=repository, self_heal=False, startup_timeout_s=600.0, workdir=workdir, extra_args=extra
        )
        self.server = TritonServer(options)

    def __enter__(self) -> Session:
        self.server.start()  # a model that fails to load fails the studies that need it (``require``)
        self.grpc = grpcclient.InferenceServerClient(self.server.grpc_url)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.grpc.close()  # an open connection would hold tritonserver's exit
        self.server.terminate()  # nothing in flight to drain: SIGTERM, and the cleanup

    def require(self, names: Sequence[str]) -> None:
        """``ServingError`` naming each of ``names`` that failed to load, with its log lines."""
        failed = [name for name in names if name in self.server.failed_models]
        if failed:
            raise ServingError(
                "; ".join(f"{n} did not load: {self.server.failed_models[n]}" for n in failed)
                + "\n"
                + "\n".join(line for n in failed for line in self.server.model_log_lines(n))
            )

    def stub_pids(self, model: str) -> list[int]:
        """The live stubs serving ``model``: memory is read per stub, so models beside it do not blur it."""
        assert self.server.pid is not None
        return [s.pid for s in server_stubs(self.server.pid) if s.alive and s.model == model]

    def stats(self, model: str) -> ModelStats:
        return model_stats(self.grpc, "grpc", model)

    def infer(
        self, model: str, arrays: dict[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        result = self.grpc.infer(model, make_inputs(grpcclient, arrays))
        return {name: result.as_numpy(name) for name in outputs}

    def timed(self, model: str, arrays: dict[str, np.ndarray], count: int, warmup: int = 2) -> list[float]:
        """Client milliseconds of ``count`` requests, one in flight, after ``warmup``."""
        inputs = make_inputs(grpcclient, arrays)
        return timed_calls(lambda: self.grpc.infer(model, inputs), count, warmup)
