"""One real server for the whole tuning run, in explicit model-control mode.

The model's files are built once (at the largest ``max_batch_size`` of the grid, so the Python
backend's shared memory fits every candidate); each candidate is then a ``load_model`` with a config
override, which takes seconds where rebuilding and restarting would take a minute. Every run returns an
``Observed``: the records and the server's own statistics over the run.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.http as httpclient

from client.stats import ModelStats
from exporters.repository import build_repository
from exporters.spec import ModelSpec, Spec
from perf.records import Record, latencies
from perf.server_view import ServerEndpoints, process_tree_cpu_s, snapshot
from perf.target import Target, target_from_spec
from perf.tune.batcher_sim import BatcherConfig
from perf.tune.cpu import CpuTimes, busy_cores, stolen_share, usable_cores
from perf.tune.engine import Engine
from perf.tune.overlay import candidate_spec, config_json
from perf.tune.steal import STOLEN_WAIT_S, Patience, Rerun, stolen, stolen_figures, unstolen
from server import ServerOptions, TritonServer, admin
from server.stubs import server_stubs

log = logging.getLogger(__name__)
SKIP_FRACTION = 0.05  # the first 5% of requests (by arrival) warm the system up; not counted in p99
RETIRE_WAIT_S = 6.0  # after a reload, at most this long for the replaced instances' stubs to exit


@dataclass
class Observed:
    """What one measurement saw, client and server side."""

    label: str
    records: list[Record]
    stats: ModelStats  # server counters over the run
    wall_s: float
    offered: float = 0.0  # open loop: arrivals per second sent
    cpu_cores: float = float("nan")  # cores the whole machine kept busy over ``wall_s`` (client included)
    stolen_share: float = float("nan")  # of the CPUs' time, what the hypervisor took (``perf.tune.steal``)
    server_cpu_s: float = float("nan")  # CPU seconds tritonserver and its backend stubs spent over ``wall_s``

    @property
    def failed(self) -> int:
        return sum(1 for r in self.records if not r.ok)

    def counted(self) -> list[Record]:
        return self.records[int(len(self.records) * SKIP_FRACTION) :]

    @property
    def p99_ms(self) -> float:
        values = latencies(self.counted())
        return float(np.percentile(values, 99) * 1e3) if values.size else float("nan")

    @property
    def mean_ms(self) -> float:
        values = latencies(self.counted())
        return float(values.mean() * 1e3) if values.size else float("nan")

    @property
    def active_s(self) -> float:
        """First arrival to last answer of the requests that succeeded: the span the load was on."""
        ok = [r for r in self.records if r.ok]
        if not ok:
            return 0.0
        return max(r.recv_s for r in ok) - min(r.arrivals[0] if r.arrivals else r.send_s for r in ok)

    @property
    def throughput(self) -> float:
        span = self.active_s
        return sum(r.batch for r in self.records if r.ok) / span if span > 0 else 0.0

    @property
    def sustained(self) -> bool:
        return self.failed == 0 and (not self.offered or self.throughput >= 0.95 * self.offered)

    def meets(self, budget_ms: float) -> bool:
        return self.sustained and self.p99_ms <= budget_ms

    def cpu_ms_per_request(self) -> tuple[float, float]:
        """(server, everything else) CPU milliseconds per request the server counted. Everything else
        is the load engine's client, mostly: on cores it shares with the server, what a client spends
        per request the server goes without, which is why a Python client sustains less than a C++ one
        against the same server (``perf.tune.witness``). NaN where either reading is missing."""
        if not self.stats.requests:
            return float("nan"), float("nan")
        machine_s = self.cpu_cores * self.wall_s
        per_request = 1e3 / self.stats.requests
        return self.server_cpu_s * per_request, (machine_s - self.server_cpu_s) * per_request

    def batch_histogram(self) -> dict[int, int]:
        return {size: bucket.executions for size, bucket in sorted(self.stats.batches.items())}

    def cpu_load(self) -> tuple[float, float, float]:
        """(requests/s, executions/s, busy cores) over the span the load was on, as the simulation
        counts them. ``cpu_cores`` covers the whole run, the workers' start margin and the last answers'
        wait included; its CPU time is put on the active span (the margins are nearly idle)."""
        span = self.active_s
        if span <= 0:
            return 0.0, 0.0, float("nan")
        cores = min(self.cpu_cores * self.wall_s / span, float(usable_cores()))
        return self.stats.requests / span, self.stats.executions / span, cores


def to_console(console: Any) -> Callable[[str], None]:
    """A session's ``notify`` for a rich console: dim, the text as it is (labels hold brackets)."""
    return lambda text: console.print(f"  {text}", style="dim", markup=False, highlight=False)


class TuneSession:
    """Build, serve and reload one model; ``with TuneSession(...) as session``."""

    def __init__(
        self,
        spec: Spec,
        model: str,
        largest_batch: int,
        workdir: Path,
        engine: Engine,
        protocol: str = "grpc",
        seed: int = 0,
        keep_queue: bool = False,
        stolen_wait_s: float = STOLEN_WAIT_S,
    ) -> None:
        self.base: ModelSpec = spec.model(model)
        self.largest_batch = max(largest_batch, self.base.max_batch_size)
        self.workdir = workdir
        self.engine = engine
        self.protocol = protocol
        self.seed = seed
        self.keep_queue = keep_queue
        self.server: TritonServer | None = None
        self.current: BatcherConfig | None = None
        self.reload_s: list[float] = []
        self.measurements = 0  # runs returned (each possibly measured again, ``stolen_reruns``)
        self.stolen_reruns: list[Rerun] = []  # runs the hypervisor took CPU from, measured again
        self.stolen_s = 0.0  # seconds of the runs measured again (the time goal leaves them out)
        self.stolen_wait_s = stolen_wait_s  # the default of ``open_loop``'s and ``closed_loop``'s wait
        # tells the user, as it happens, of a run measured again: on a host the hypervisor takes CPU from
        # all along the wait can stretch a tune by hours, and the console would say nothing meanwhile
        self.notify: Callable[[str], None] = lambda text: None
        self._steal_advised = False  # the pointer to steal_check, once
        self.patience = Patience()  # stops waiting out steal on a host stolen from throughout
        self._target: Target | None = None

    def __enter__(self) -> TuneSession:
        repository = self.workdir / "repository"
        build_spec = dataclasses.replace(self.base, max_batch_size=self.largest_batch, warmup=False)
        build_repository(Spec(models=(build_spec,)), repository, num_gpus=0)
        options = ServerOptions(
            repository=repository,
            model_control_mode="explicit",
            load_models=[self.base.name],
            log_path=self.workdir / "server.log",
            startup_timeout_s=240,
        )
        self.server = TritonServer(options).start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    @property
    def endpoints(self) -> ServerEndpoints:
        assert self.server is not None
        return ServerEndpoints(self.server.http_url, self.server.metrics_url, self.server.pid)

    @property
    def target(self) -> Target:
        if self._target is None:
            assert self.server is not None
            url = self.server.grpc_url if self.protocol == "grpc" else self.server.http_url
            self._target = target_from_spec(
                self.base, url, self.protocol, seed=self.seed, rows=self.largest_batch
            )
        return self._target

    def cycle_through(self, pool: dict[str, np.ndarray]) -> None:
        """Send the rows of ``pool`` in turn (each request the next ones, wrapping) instead of the same
        first rows every time: traffic whose samples differ (the recsys scenario's Zipf ids)."""
        self._target = dataclasses.replace(self.target, inputs=pool, cycle=True)

    def load(self, config: BatcherConfig) -> float:
        """Reload the model with ``config`` (no-op if already loaded); returns the seconds it took."""
        if config == self.current:
            return 0.0
        assert self.server is not None
        started = time.perf_counter()
        client = httpclient.InferenceServerClient(self.server.http_url)
        try:
            config_text = config_json(candidate_spec(self.base, config, self.keep_queue))
            # the repository API is keyed on every server we start (server.admin)
            admin.load_model(client, self.server.admin_key, self.base.name, config=json.loads(config_text))
        finally:
            client.close()
        self.current = config
        took = time.perf_counter() - started
        self.reload_s.append(took)
        log.info("loaded %s in %.1f s", config.label, took)
        return took

    def prepare(self, config: BatcherConfig) -> float:
        """Load ``config`` for a measurement: after a reload, wait (at most ``RETIRE_WAIT_S``) until
        the replaced instances' stubs have exited. ``load_model`` returns while they still run: here
        1.1-2.6 s more, one stub after the other, so the first 3 s point after a reload shared the two
        cores with their exit. Over ten exhaustive tunes, where a point missed the budget and was
        measured again, the first run right after a reload had a p99 21% above its repeat (median of
        175 pairs), other first runs 4% (454 pairs); a challenger's first point always follows its
        reload. The new instances warm up at load (``model_warmup``). ``load`` stays a bare reload
        (``--follow`` reloads under the user's traffic). Returns the seconds both took."""
        started = time.perf_counter()
        if not self.load(config):
            return 0.0
        deadline = started + RETIRE_WAIT_S
        while self.live_stubs() > config.instances and time.perf_counter() < deadline:
            time.sleep(0.05)
        return time.perf_counter() - started

    def live_stubs(self) -> int:
        """The loaded model's live Python-backend stubs (0 for other backends)."""
        assert self.server is not None
        if self.server.pid is None:
            return 0
        name = self.target.model
        return sum(
            1 for s in server_stubs(self.server.pid) if s.alive and s.model == name and s.instance != name
        )

    def _stats(self) -> Any:
        """The server's counters now (what ``_delta`` takes two of)."""
        return snapshot(self.endpoints, self.base.name, 0.0).stats

    def _delta(self, before: Any, after: Any) -> ModelStats:
        """The model's statistics between two ``_stats`` snapshots."""
        return after - before

    def _observe(
        self, label: str, run: Callable[[], list[Record]], offered: float = 0.0, wait_s: float | None = None
    ) -> Observed:
        """One run, measured again while the hypervisor took CPU from it, for at most ``wait_s`` of runs
        (``perf.tune.steal``; the session's ``stolen_wait_s`` by default, none while ``patience`` is out)."""
        asked_s = self.stolen_wait_s if wait_s is None else wait_s
        wait_s = self.patience.wait_for(asked_s)

        def discarding(discarded: Observed, so_far: list[Observed]) -> None:
            log.info(
                "%s: %.1f%% of the CPUs' time stolen (p99 %.1f ms): measured again",
                label,
                100 * discarded.stolen_share,
                discarded.p99_ms,
            )
            if len(so_far) == 1:
                self.notify(
                    f"{label}: the hypervisor took {100 * discarded.stolen_share:.1f}% of the CPUs' time "
                    f"(p99 {discarded.p99_ms:.1f} ms): measuring again, for up to {wait_s:.0f} s "
                    "(--stolen-wait-s)"
                )

        observed, again = unstolen(lambda: self._observe_once(label, run, offered), wait_s, discarding)
        self.measurements += 1
        if again:
            self.stolen_reruns.append(Rerun(tuple(again), observed))
            spent = sum(discarded.wall_s for discarded in again)
            self.stolen_s += spent
            outcome = "counted a run not stolen"
            if stolen(observed):
                outcome = f"counted still stolen ({100 * observed.stolen_share:.1f}%)"
                if not self._steal_advised:  # said once a session
                    self._steal_advised = True
                    outcome += (
                        ": the host's steal is in its figures, as in any run counted so "
                        "(python -m perf.tune.steal_check measures how much)"
                    )
            runs = f"{len(again)} run{'s' if len(again) > 1 else ''}"
            self.notify(f"{label}: {runs} ({spent:.0f} s) measured again, {outcome}")
        change = self.patience.counted(observed, again, asked_s)
        if change:
            log.info("%s: %s", label, change)
            self.notify(f"{label}: {change}")
        return observed

    def stolen_figures(self) -> dict:
        """The report's figures on the runs this session measured again (``perf.tune.steal``)."""
        return stolen_figures(
            self.stolen_reruns, self.measurements, self.stolen_wait_s, self.patience.unwaited
        )

    def _server_cpu_s(self) -> float:
        """CPU seconds tritonserver and its backend stubs have spent so far (NaN without its pid)."""
        pid = self.server.pid if self.server is not None else None
        return process_tree_cpu_s(pid) if pid else float("nan")

    def _observe_once(self, label: str, run: Callable[[], list[Record]], offered: float) -> Observed:
        before, server_before = self._stats(), self._server_cpu_s()
        started, cpu_before = time.perf_counter(), CpuTimes.now()
        records = run()
        wall, cpu_after = time.perf_counter() - started, CpuTimes.now()
        server_after = self._server_cpu_s()
        time.sleep(0.2)  # Triton counts a request just after answering it
        observed = Observed(label, records, self._delta(before, self._stats()), wall, offered)
        observed.cpu_cores = busy_cores(cpu_before, cpu_after, usable_cores())
        observed.stolen_share = stolen_share(cpu_before, cpu_after)
        observed.server_cpu_s = server_after - server_before
        return observed

    def open_loop(self, arrivals_s: Sequence[float], label: str, wait_s: float | None = None) -> Observed:
        """``arrivals_s`` replayed open loop; ``wait_s``: at most this many seconds of runs measured
        again while stolen (0: never, e.g. ``--follow``'s trace, one replay with its reloads in it)."""
        arrivals = np.asarray(arrivals_s, dtype=float)
        offered = len(arrivals) / arrivals[-1] if len(arrivals) > 1 and arrivals[-1] > 0 else 0.0
        return self._observe(
            label, lambda: self.engine.open_loop(self.target, arrivals, label), offered, wait_s
        )

    def closed_loop(self, concurrency: int, seconds: float, label: str) -> Observed:
        return self._observe(label, lambda: self.engine.closed_loop(self.target, concurrency, seconds, label))

    def config_text(self) -> str:
        """The model's configuration as the server reports it now (for the report)."""
        assert self.server is not None
        client = httpclient.InferenceServerClient(self.server.http_url)
        try:
            return json.dumps(client.get_model_config(self.base.name), indent=1)
        finally:
            client.close()
