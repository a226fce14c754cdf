"""What the prediction needs, measured in one ramp of open loops per instance count and one without
batching (docs/TUNE.md, "Probe"): the compute fit, the costs beyond it, the overhead outside the server
and the CPU term. A ramp stops at a p99 over ``FAR_MISS`` × the budget: no higher rate says anything
about the budget, and deeper overload only makes runs long and the host slow.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from client.stats import ModelStats
from perf.measure.loads import arrival_times, poisson
from perf.measure.measurement import Measurement
from perf.model.batcher import BatcherConfig, ServiceModel, simulate
from perf.model.cpu import CpuModel, fit_cpu_model
from perf.model.latency import LatencyFit, busy_per_batch_ms, fit_compute, per_batch_and_request_ms, slice_for
from perf.session.search import FAR_MISS
from perf.session.search import Server as MeasuringServer

log = logging.getLogger(__name__)


class Server(MeasuringServer, Protocol):
    """The real server (``perf.session.model``) or a simulated one: ``measure`` runs on what was prepared."""

    cores: int  # the cores the server and its clients share (the CPU term's ``c``)

    def prepare(self, config: BatcherConfig) -> None: ...


@dataclass(frozen=True)
class ProbePlan:
    first_rate: float = 50.0  # requests/s of the first run: requests seldom overlap
    step: float = 1.6  # each run of a ramp offers this × the one before
    max_runs: int = 10  # per ramp: a server that keeps up with all of them saturates at the last
    seed: int = 1
    busy_enough: float = 0.3  # runs whose predicted utilization reaches this calibrate the CPU wait


@dataclass
class ProbeResult:
    services: dict[int, ServiceModel]  # instances -> service model, its CPU term included
    fits: dict[int, LatencyFit]
    overhead_ms: float
    per_batch_ms: float  # per-execution cost beyond compute (calibrated with one instance)
    per_request_ms: dict[int, float]  # per-request cost beyond compute, per instance count
    runs: list[tuple[BatcherConfig, Measurement]] = field(default_factory=list)  # every run, in order
    saturation: dict[int, Measurement] = field(default_factory=dict)  # per instance count; 0: unbatched
    floor_p99_ms: float = 0.0  # p99 at the first, lowest rate
    seconds: float = 0.0  # wall time of the probe's measurements (reloads included)

    @property
    def cpu(self) -> CpuModel | None:
        return next(iter(self.services.values())).cpu


def _ramp(
    server: Server, config: BatcherConfig, rate: float, plan: ProbePlan,
    out: list[tuple[BatcherConfig, Measurement]], budget_ms: float | None = None,
) -> Measurement:  # fmt: skip
    """``config`` from ``rate`` up until the server fell behind twice at one rate (one disturbed run does
    not end a ramp); the saturation: the one of the two that served the most."""
    server.prepare(config)
    behind: list[Measurement] = []
    for _ in range(plan.max_runs):
        run = server.measure(poisson(rate, plan.seed), f"probe {config.label} @ {rate:.0f}/s")
        out.append((config, run))
        figures = run.throughput, run.stats.mean_batch, run.p99_ms
        log.info("%s: served %.0f/s, mean batch %.1f, p99 %.1f ms", run.label, *figures)
        if over := budget_ms is not None and not run.p99_ms <= FAR_MISS * budget_ms:
            log.info(
                "%s: p99 over %g× the %g ms budget: the rate goes no higher", run.label, FAR_MISS, budget_ms
            )
        if run.sustained and not over:
            behind = []
            rate *= plan.step
            continue
        behind.append(run)
        if len(behind) == 2:
            return max(behind, key=lambda r: r.throughput)
    log.warning("%s: the ramp ended at %.0f/s without the server falling behind twice", config.label, rate)
    return max(behind, key=lambda r: r.throughput) if behind else run


def _server_ms_per_request(stats: ModelStats) -> float:
    return (stats.queue_ns + stats.compute_ns) / stats.requests / 1e6 if stats.requests else 0.0


def probe(
    server: Server, instance_counts: tuple[int, ...], max_batch: int, plan: ProbePlan | None = None,
    budget_ms: float | None = None,
) -> ProbeResult:  # fmt: skip
    plan = plan or ProbePlan()
    started = time.perf_counter()
    runs, saturation = _ramps(server, instance_counts, max_batch, plan, budget_ms)
    first = runs[0][1]
    overhead = max(0.0, first.figures.mean_ms - _server_ms_per_request(first.stats))
    fits, per_batch, per_request = _costs(runs, saturation, instance_counts)
    services = {
        n: ServiceModel(f.t_ms / 1e3, f.dt_ms / 1e3, per_request[n] / 1e3, overhead / 1e3, per_batch / 1e3)
        for n, f in fits.items()
    }
    services = _with_cpu(services, runs, server.cores, plan)
    return ProbeResult(
        services, fits, overhead, per_batch, per_request, runs, saturation, first.p99_ms,
        time.perf_counter() - started,
    )  # fmt: skip


def _ramps(
    server: Server, instance_counts: tuple[int, ...], max_batch: int, plan: ProbePlan, budget_ms: float | None
) -> tuple[list[tuple[BatcherConfig, Measurement]], dict[int, Measurement]]:
    """Every run in order, and each instance count's saturation (0: unbatched); each ramp starts from what
    the first run (a request alone) or the ramp before it served."""
    first_config = BatcherConfig(max_batch, 0, instances=instance_counts[0])
    server.prepare(first_config)
    label = f"probe {first_config.label} @ {plan.first_rate:.0f}/s"
    first = server.measure(poisson(plan.first_rate, plan.seed), label)
    runs: list[tuple[BatcherConfig, Measurement]] = [(first_config, first)]
    alone_ms = max(first.stats.request_ms_per_request, _server_ms_per_request(first.stats), 0.05)
    rate = max(plan.first_rate, 0.5 * 1e3 / alone_ms)
    saturation: dict[int, Measurement] = {}
    for instances in instance_counts:
        saturation[instances] = _ramp(
            server, BatcherConfig(max_batch, 0, instances=instances), rate, plan, runs, budget_ms
        )
        rate = max(plan.first_rate, 0.6 * saturation[instances].throughput)
    unbatched = max(plan.first_rate, 0.8 * 1e3 / alone_ms)
    saturation[0] = _ramp(server, BatcherConfig(1), unbatched, plan, runs, budget_ms)
    return runs, saturation


def _costs(
    runs: list[tuple[BatcherConfig, Measurement]], saturation: dict[int, Measurement], counts: tuple[int, ...]
) -> tuple[dict[int, LatencyFit], float, dict[int, float]]:
    """Per instance count the compute fit and the per-request cost beyond it; the per-execution cost from
    the first count's saturation with and without batching."""
    fits, per_request, per_batch = {}, {}, 0.0
    for instances in counts:
        own = [run.stats for config, run in runs if config.instances == instances and config.batching]
        stats = sum(own, ModelStats())
        fits[instances] = fit = fit_compute(
            {s: b.compute_ns / b.executions / 1e6 for s, b in stats.batches.items()},
            {s: b.executions for s, b in stats.batches.items()},
        )
        sat = saturation[instances]
        batched = (sat.stats.mean_batch, busy_per_batch_ms(sat.stats.mean_batch, sat.throughput, instances))
        if instances == counts[0]:
            single = (1.0, busy_per_batch_ms(1.0, saturation[0].throughput, 1))
            per_batch, per_request[instances] = per_batch_and_request_ms(single, batched, fit)
        else:
            extra = batched[1] - fit.batch_ms(batched[0]) - per_batch
            per_request[instances] = max(0.0, extra / max(batched[0], 1.0))
    return fits, per_batch, per_request


def _with_cpu(
    services: dict[int, ServiceModel],
    runs: list[tuple[BatcherConfig, Measurement]],
    cores: int,
    plan: ProbePlan,
) -> dict[int, ServiceModel]:
    """``services`` with the CPU term: one busy-core fit over the runs that kept up (overload keeps every
    core busy whatever the rate), and per instance count the median slice of its busier runs."""
    kept_up = [(config, run) for config, run in runs if run.sustained and run.server]
    loads = [run.server.cpu_load() for _, run in kept_up]
    cpu = fit_cpu_model([x[0] for x in loads], [x[1] for x in loads], [x[2] for x in loads], cores)
    slices: dict[int, list[float]] = {}
    for instances, service in services.items():
        own = [(c, run) for c, run in kept_up if c.instances == instances and c.batching]
        with_cpu = dataclasses.replace(service, cpu=cpu)
        simulated = [(c, run, simulate(arrival_times(run.load, 3.0), c, with_cpu)) for c, run in own]
        busy = [(c, run) for c, run, sim in simulated if sim.cpu_utilization >= plan.busy_enough] or own
        slices[instances] = [
            slice_for(arrival_times(run.load, 3.0), c, service, cpu, run.p99_ms) for c, run in busy
        ]
    pooled = [value for values in slices.values() for value in values]
    log.info("CPU model %s; wait slices (s) per instance count: %s", cpu, slices)
    return {
        n: dataclasses.replace(
            service, cpu=dataclasses.replace(cpu, slice_s=float(np.median(slices[n] or pooled or [0.0])))
        )
        for n, service in services.items()
    }
