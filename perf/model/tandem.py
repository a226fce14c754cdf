"""A tandem of batchers: the stages of a split model, each Triton's dynamic batcher, with a link between
consecutive stages (docs/PLAN.md, "Prediction"). Beyond the single batcher's rules: an ensemble hands
a batch's responses on at once, so they cross the boundary as one transfer; a link carries one
transfer at a time (a boundary whose bytes outgrow it queues there: "link-bound"); the client,
network and frontend are crossed once per request (``overhead_s``), not per stage."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from perf.errors import OptionError
from perf.measure.loads import Load, arrival_times
from perf.model.batcher import BatcherConfig, ServiceModel, SimResult, simulate
from perf.model.links import Transfer
from perf.model.predict import ARRIVALS_MAX, Prediction, capacity_bound, prediction


@dataclass(frozen=True)
class TandemStage:
    """One stage: its batcher and how long its instances take per batch (no overhead of its own)."""

    config: BatcherConfig
    service: ServiceModel


def simulate_tandem(
    arrivals_s: Sequence[float], stages: Sequence[TandemStage], transfers: Sequence[Transfer],
    overhead_s: float = 0.0, seed: int = 0,
) -> SimResult:  # fmt: skip
    """Run ``arrivals_s`` (sorted seconds) through ``stages`` with ``transfers[k]`` between stage k and k+1
    (requests reach stage k+1 in the order their transfers end), as one batcher's run (``batch_sizes``:
    the first stage's); stage k's CPU waits draw with ``seed + k``."""
    if not stages:
        raise OptionError("a tandem needs at least one stage")
    if len(transfers) != len(stages) - 1:
        raise OptionError(f"{len(stages)} stages need {len(stages) - 1} transfers, got {len(transfers)}")
    origin = np.asarray(arrivals_s, dtype=float)
    count = len(origin)
    ids = np.arange(count)  # the original request behind each position of the current stage's order
    times = origin.copy()
    batches: list[np.ndarray] = []  # per stage, the formed batch sizes
    for k, stage in enumerate(stages):
        service = replace(stage.service, overhead_s=0.0)
        result = simulate(times, stage.config, service, seed + k)
        done = times + result.latencies_s
        batches.append(result.batch_sizes)
        if k == len(stages) - 1:
            times = done
            break
        transfer, link_free = transfers[k], 0.0
        arrive = np.empty(count)
        stops = np.cumsum(result.batch_sizes)  # [start, stop) of each formed batch in the stage's order
        spans = zip((stops - result.batch_sizes).tolist(), stops.tolist(), strict=True)
        for start, stop in sorted(spans, key=lambda span: done[span[0]]):
            link_free = max(done[start], link_free) + transfer.seconds(stop - start)  # one at a time
            arrive[start:stop] = link_free
        order = np.argsort(arrive, kind="stable")
        ids, times = ids[order], arrive[order]
    latencies = np.empty(count)
    latencies[ids] = times - origin[ids] + overhead_s
    span = float(times.max() - origin[0]) if count else 0.0
    return SimResult(latencies, batches[0], span)


def predict_tandem(
    stages: Sequence[TandemStage], transfers: Sequence[Transfer], load: Load, overhead_s: float = 0.0,
    seconds: float = 6.0,
) -> Prediction:  # fmt: skip
    """The tandem at ``load``, as ``predict`` for one batcher (labelled with the first stage's config)."""
    arrivals = arrival_times(load, seconds, ARRIVALS_MAX)
    result = simulate_tandem(arrivals, stages, transfers, overhead_s)
    return prediction(stages[0].config, load.rate, result, arrivals)


def tandem_bound(stages: Sequence[TandemStage], transfers: Sequence[Transfer]) -> float:
    """Requests per second no rate exceeds: the slowest stage at full batches, or the slowest link."""
    computes = [capacity_bound(s.config, s.service) for s in stages]
    links = [t.capacity(stages[0].config.max_batch_size) for t in transfers]
    return min(computes + links)
