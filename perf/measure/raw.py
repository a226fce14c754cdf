"""The raw backend: the same ONNX file in-process in onnxruntime, same threads, same batch sizes: the
physical reference served throughput and server CPU are compared with.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from python_backend.onnxruntime.ort_session import open_session


@dataclass(frozen=True)
class RawPoint:
    batch: int
    batch_ms: float  # median time of one run at this batch size
    throughput: float  # samples per second
    cpu_s_per_1000: float  # process CPU seconds per 1,000 samples


def measure_raw(
    onnx_path: Path, inputs: dict[str, np.ndarray], batch_sizes: Sequence[int], intra_op_threads: int = 1,
    inter_op_threads: int = 1, seconds: float = 0.5, repeats: int = 5,
    providers: Sequence[str] = ("CPUExecutionProvider",),
) -> list[RawPoint]:  # fmt: skip
    """Time ``session.run`` at each batch size (the first ``b`` rows of ``inputs``): ``repeats`` rounds
    of ~``seconds/repeats``, the median round."""
    session = open_session(str(onnx_path), intra_op_threads, inter_op_threads, list(providers))
    points = []
    for batch in batch_sizes:
        feeds = {name: pool[:batch] for name, pool in inputs.items()}
        for _ in range(3):
            session.run(None, feeds)
        rounds, runs, cpu = [], 0, 0.0
        for _ in range(repeats):
            count, cpu_start, start = 0, time.process_time(), time.perf_counter()
            while not count or (elapsed := time.perf_counter() - start) < seconds / repeats:
                session.run(None, feeds)
                count += 1
            cpu += time.process_time() - cpu_start
            runs += count
            rounds.append(elapsed / count)
        batch_s = float(np.median(rounds))
        points.append(RawPoint(batch, batch_s * 1e3, batch / batch_s, 1000 * cpu / (runs * batch)))
    return points
