"""A real Prometheus scraping a real tritonserver: the rules record what the server itself reports.

The server is started through ``python -m server.container`` (the image's entry point: the supervisor,
with tritonserver as its child) with explicit model control; Prometheus 2.42 (Debian) scrapes it every
second on loopback with the project's rule files. Two changes make the rules fit a test of seconds, not
minutes: their ``[1m]`` rate windows become ``[10s]`` and every alert's ``for:`` becomes 1 s; the
expressions are otherwise the shipped ones. A short closed-loop load runs while the server's own
statistics are polled; then the recorded throughput, queue time and batch size are compared with the
server's figures for the same window, the Prometheus Adapter's queries are evaluated as the adapter
would, every dashboard query is run, and unloading a model must fire ``TritonModelNotReady``.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as http
import yaml
from deploy_tools import K8S, MONITORING, ROOT, RULE_FILES, tool
from tritonclient.utils import InferenceServerException

from client.stats import ModelStats, model_stats
from exporters.repository import build_repository
from exporters.schema.models import parse_spec
from server import admin
from server.container import ADMIN_KEY_ENV
from server.launcher import remove_shm_regions
from server.ports import free_port, free_ports
from server.proc_stat import stat_fields

pytestmark = pytest.mark.integration
log = logging.getLogger(__name__)

TEST_ADMIN_KEY = "deploy-test-admin-key"
WINDOW_S = 10  # the rules' rate window in this test
LOAD_S = 14  # > WINDOW_S + 2: one recorded sample whose whole window lies inside the load
CLIENTS = 4
MODEL, SPARE = "trivial", "trivial_spare"
SLOW = "trivial_slow"  # its batcher holds a lone request 2 s: a request surely in flight at SIGTERM
SCRAPED = f'nv_inference_request_success{{model="{MODEL}"}}'
RECORDED = f'model:triton_queue_us:p99_max{{model="{MODEL}"}}'
SETTLE_GUARD_S = 60  # a hang guard: how long Prometheus may take to scrape and evaluate after the load


def _get_json(url: str, timeout: float = 5) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def _wait(condition, timeout: float, what: str, interval: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")


class Prometheus:
    """The HTTP API of the test's Prometheus."""

    def __init__(self, base: str) -> None:
        self.base = base

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
        answer = _get_json(f"{self.base}/api/v1/query?{urllib.parse.urlencode(params)}")
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def value(self, expr: str, at: float | None = None) -> float:
        result = self.query(expr, at)
        assert len(result) == 1, f"{expr}: expected one series, got {result}"
        return float(result[0]["value"][1])

    def last_sample(self, series: str, at: float) -> tuple[float, float]:
        """The last stored sample of a recorded series at or before ``at``: (timestamp, value)."""
        result = self.query(f"{series}[5s]", at)
        assert len(result) == 1, f"{series}: expected one series at {at}, got {result}"
        stamp, value = result[0]["values"][-1]
        return float(stamp), float(value)

    def window_edges(self, series: str, at: float, seconds: int = WINDOW_S) -> tuple[float, float]:
        """First and last scraped value of a counter inside the window of ``seconds`` ending at ``at``."""
        result = self.query(f"{series}[{seconds}s]", at)
        assert len(result) == 1, f"{series}: expected one series at {at}, got {result}"
        values = result[0]["values"]
        return float(values[0][1]), float(values[-1][1])

    def latest_stamp(self, series: str) -> float | None:
        """When the newest stored sample of ``series`` was taken (scraped or evaluated), if there is one."""
        result = self.query(f"max(timestamp({series}))")
        return float(result[0]["value"][1]) if result else None

    def alerts(self) -> list[dict[str, Any]]:
        return _get_json(f"{self.base}/api/v1/alerts")["data"]["alerts"]


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL if it is still there after 30 s."""
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


@dataclass
class Triton:
    process: subprocess.Popen  # the container's main process: the supervisor
    http_url: str
    metrics_port: int
    log_path: Path
    probe_port: int
    argv: list[bytes] = field(default_factory=list)  # tritonserver's


def _child(pid: int) -> int:
    """The one child process of ``pid`` (the supervisor's tritonserver)."""
    children = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _parent(p) == pid]
    assert len(children) == 1, f"expected one child of {pid}, found {children}"
    return children[0]


def _parent(proc: Path) -> int:
    fields = stat_fields(proc / "stat")
    return int(fields[1]) if fields else -1


@dataclass
class LoadRun:
    """Server statistics polled during the load: (time, stats) pairs, and the load's edges."""

    polls: list[tuple[float, ModelStats]] = field(default_factory=list)
    start: float = 0.0
    end: float = 0.0
    settled: float = 0.0  # a rule evaluation that saw a scrape taken after the load: nothing moves then
    sent: int = 0
    failed: int = 0

    def at(self, moment: float) -> ModelStats:
        """Server counters at ``moment``, interpolated linearly between the two polls around it."""
        return self._between(moment, lambda poll: poll[0])

    def after_requests(self, count: float) -> ModelStats:
        """Server counters once its ``count``-th request had succeeded (interpolated between polls)."""
        return self._between(count, lambda poll: poll[1].requests)

    def _between(self, x: float, key: Callable[[tuple[float, ModelStats]], float]) -> ModelStats:
        before = max((p for p in self.polls if key(p) <= x), key=key)
        after = min((p for p in self.polls if key(p) >= x), key=key)
        if key(after) == key(before):
            return before[1]
        share = (x - key(before)) / (key(after) - key(before))
        delta = after[1] - before[1]
        return ModelStats(
            requests=before[1].requests + round(share * delta.requests),
            inferences=before[1].inferences + round(share * delta.inferences),
            executions=before[1].executions + round(share * delta.executions),
            queue_ns=before[1].queue_ns + round(share * delta.queue_ns),
        )


@pytest.fixture(scope="module")
def repository(spec_data: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = copy.deepcopy(spec_data)
    trivial = next(m for m in data["models"] if m["name"] == MODEL)
    slow = {**copy.deepcopy(trivial), "name": SLOW, "warmup": False}
    slow["batching"] = {"mode": "dynamic", "max_queue_delay_us": 2_000_000}
    data["models"] = [trivial, {**copy.deepcopy(trivial), "name": SPARE}, slow]
    data.pop("pipelines", None)
    repository = tmp_path_factory.mktemp("prometheus_repository")
    build_repository(parse_spec(data), repository, num_gpus=0)
    return repository


@pytest.fixture(scope="module")
def triton(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Triton]:
    workdir = tmp_path_factory.mktemp("triton")
    http_port, grpc_port, metrics_port, probe_port = free_ports(["127.0.0.1"] * 4)
    log_path = workdir / "server.log"
    command = [sys.executable, "-m", "server.container", "--repository", str(repository)]
    command += ["--host", "127.0.0.1", "--http-port", str(http_port), "--grpc-port", str(grpc_port)]
    command += ["--metrics-port", str(metrics_port)]
    command += ["--exit-timeout", "5", "--workdir", str(workdir / "backend"), "--probe-port", str(probe_port)]
    environment = {**os.environ, ADMIN_KEY_ENV: TEST_ADMIN_KEY}  # as the pod's Secret would set it
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=environment)
    server = Triton(process, f"127.0.0.1:{http_port}", metrics_port, log_path, probe_port)
    try:

        def ready() -> bool:
            assert process.poll() is None, f"server exited:\n{log_path.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(f"http://{server.http_url}/v2/health/ready", timeout=2) as answer:
                    return answer.status == 200
            except OSError:
                return False

        _wait(ready, 240, "tritonserver readiness")
        server.argv = Path(f"/proc/{_child(process.pid)}/cmdline").read_bytes().split(b"\0")
        yield server
    finally:
        _stop(process)
        for arg in server.argv:
            if b"shm-region-prefix-name=" in arg:
                remove_shm_regions(arg.split(b"=")[-1].decode())


def _test_rules(target: Path) -> list[Path]:
    """The shipped rule files with ``[1m]`` windows → ``[10s]`` and ``for:`` → 1 s."""
    target.mkdir()
    written = []
    for path in RULE_FILES:
        text = path.read_text()
        groups = yaml.safe_load(text)["groups"]
        for group in groups:
            for rule in group["rules"]:
                rule["expr"] = rule["expr"].replace("[1m]", f"[{WINDOW_S}s]")
                if "for" in rule:
                    rule["for"] = "1s"
        out = target / path.name
        out.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
        written.append(out)
    assert "[1m]" in RULE_FILES[0].read_text(), "the recording rules no longer use 1m windows"
    return written


@pytest.fixture(scope="module")
def prometheus(triton: Triton, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    binary = tool("prometheus")
    workdir = tmp_path_factory.mktemp("prometheus")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(p) for p in _test_rules(workdir / "rules")],
        "scrape_configs": [
            {"job_name": "triton", "static_configs": [{"targets": [f"127.0.0.1:{triton.metrics_port}"]}]}
        ],
    }
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log_path = workdir / "prometheus.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=1h",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    api = Prometheus(f"http://127.0.0.1:{port}")
    try:

        def scraping() -> bool:
            assert process.poll() is None, f"prometheus exited:\n{log_path.read_text()[-3000:]}"
            try:
                return bool(api.query(f'nv_inference_count{{model="{MODEL}"}}'))
            except OSError:
                return False

        _wait(scraping, 60, "Prometheus to scrape the server")
        yield api
    finally:
        _stop(process)


@pytest.fixture(scope="module")
def load_run(triton: Triton, prometheus: Prometheus) -> LoadRun:
    """A closed loop of CLIENTS workers for LOAD_S seconds, server statistics polled all along."""
    run = LoadRun()
    stats_client = http.InferenceServerClient(triton.http_url)
    stop_polling = threading.Event()

    def poll() -> None:
        while not stop_polling.is_set():
            before = time.time()
            stats = model_stats(stats_client, "http", MODEL)
            run.polls.append(((before + time.time()) / 2, stats))
            time.sleep(0.1)

    def worker(counts: list[int]) -> None:
        client = http.InferenceServerClient(triton.http_url)
        data = np.ones((1, 16), dtype=np.float32)
        deadline = time.time() + LOAD_S
        for _ in range(50_000):  # bounded in count as well as time
            if time.time() >= deadline:
                break
            tensor = http.InferInput("x", [1, 16], "FP32")
            tensor.set_data_from_numpy(data)
            counts[0] += 1
            try:
                client.infer(MODEL, [tensor])
            except InferenceServerException:
                counts[1] += 1

    poller = threading.Thread(target=poll)
    poller.start()
    _wait(lambda: run.polls, SETTLE_GUARD_S, "a poll of the server before the load")  # the windows' left edge
    counts = [[0, 0] for _ in range(CLIENTS)]
    workers = [threading.Thread(target=worker, args=(c,)) for c in counts]
    run.start = time.time()
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join(timeout=LOAD_S + 60)
    run.end = time.time()
    run.settled = _settled(prometheus, run.end)
    _wait(lambda: run.polls[-1][0] > run.settled, SETTLE_GUARD_S, "a poll of the server after that")
    stop_polling.set()
    poller.join(timeout=10)
    run.sent = sum(c[0] for c in counts)
    run.failed = sum(c[1] for c in counts)
    assert run.sent > 100 and run.failed == 0, f"load: {run.sent} sent, {run.failed} failed"
    return run


def _settled(prometheus: Prometheus, end: float) -> float:
    """The timestamp of a rule evaluation that ran once a scrape taken after ``end`` was stored.

    Waiting for these samples, not for a fixed time, keeps a starved Prometheus from failing the
    tests that read after the load: a scrape that started after the last answer holds the final
    counters, and a rule evaluated at a later instant than the one that scrape was seen at has read it."""
    scrape_seen_at = _wait(
        lambda: (stamp := prometheus.latest_stamp(SCRAPED)) is not None and stamp > end and time.time(),
        SETTLE_GUARD_S,
        "Prometheus to scrape the server after the load",
    )
    return _wait(
        lambda: (stamp := prometheus.latest_stamp(RECORDED)) is not None and stamp > scrape_seen_at and stamp,
        SETTLE_GUARD_S,
        "Prometheus to evaluate its rules over that scrape",
    )


def _window(run: LoadRun, end: float) -> ModelStats:
    """The server's own counters over the rules' window ending at ``end``."""
    return run.at(end) - run.at(end - WINDOW_S)


def test_raw_counters_equal_the_server_statistics(prometheus: Prometheus, load_run: LoadRun) -> None:
    final = load_run.polls[-1][1]
    at = load_run.polls[-1][0]
    selector = f'{{job="triton", model="{MODEL}"}}'
    assert prometheus.value(f"sum(nv_inference_request_success{selector})", at) == final.requests
    assert prometheus.value(f"sum(nv_inference_count{selector})", at) == final.inferences
    assert prometheus.value(f"sum(nv_inference_exec_count{selector})", at) == final.executions
    queue_us = prometheus.value(f"sum(nv_inference_queue_duration_us{selector})", at)
    # Triton adds each request's queue time in whole µs to the metric and in ns to the statistics.
    assert abs(queue_us - final.queue_ns / 1000) <= final.requests
    assert final.requests >= load_run.sent  # every request of the load reached the statistics


def test_recorded_throughput_queue_time_and_batch_size_match_the_server(
    prometheus: Prometheus, load_run: LoadRun
) -> None:
    """Recording rules vs the server's statistics over the same 10 s window, inside the load.

    Throughput is compared over the same 10 s of wall time: the rule sees counters at Prometheus's
    scrape instants (each a little late on a busy machine) and ``rate()`` extrapolates to the window's
    edges, the polls see them every ~0.1 s; 15% covers that on 2 shared cores. Queue time and batch
    size are compared over the same *requests*: those between the first and the last scrape inside the
    rule's window, found in the server's statistics by their count, so clock alignment drops out and
    10% covers the polls' spacing. A wrong rule (metric, unit, window) is off by far more.
    """
    selector = f'{{job="triton", model="{MODEL}"}}'
    stamp, requests_rate = prometheus.last_sample(
        f"instance_model:triton_requests:rate1m{selector}", load_run.end - 1
    )
    assert stamp - WINDOW_S >= load_run.start, "the recorded window must lie inside the load"
    server = _window(load_run, stamp)
    log.info("requests/s: recorded %.1f, server %.1f", requests_rate, server.requests / WINDOW_S)
    assert requests_rate == pytest.approx(server.requests / WINDOW_S, rel=0.15)

    stamp, inferences_rate = prometheus.last_sample(
        f"instance_model:triton_inferences:rate1m{selector}", load_run.end - 1
    )
    assert inferences_rate == pytest.approx(_window(load_run, stamp).inferences / WINDOW_S, rel=0.15)

    def same_requests(stamp: float) -> ModelStats:
        first, last = prometheus.window_edges(f"nv_inference_request_success{selector}", stamp)
        assert last - first > 100
        return load_run.after_requests(last) - load_run.after_requests(first)

    stamp, queue_us = prometheus.last_sample(
        f"instance_model:triton_queue_us_per_request:mean1m{selector}", load_run.end - 1
    )
    server = same_requests(stamp)
    server_queue_us = server.queue_ns / 1000 / server.requests
    log.info("queue µs/request: recorded %.1f, server %.1f", queue_us, server_queue_us)
    assert queue_us > 0
    assert queue_us == pytest.approx(server_queue_us, rel=0.10)

    stamp, batch = prometheus.last_sample(
        f"instance_model:triton_batch_size:mean1m{selector}", load_run.end - 1
    )
    server = same_requests(stamp)
    log.info("mean batch: recorded %.2f, server %.2f", batch, server.inferences / server.executions)
    assert batch == pytest.approx(server.inferences / server.executions, rel=0.10)


def test_latency_summaries_are_recorded(prometheus: Prometheus, load_run: LoadRun) -> None:
    at = load_run.end
    p50 = prometheus.value(f'model:triton_request_us:p50_max{{model="{MODEL}"}}', at)
    p99 = prometheus.value(f'model:triton_request_us:p99_max{{model="{MODEL}"}}', at)
    assert 0 < p50 <= p99
    # The queue's p99 is the server's own figure (every request of the load waited in the batcher's
    # queue, so it is above 0): read after the load, when the summary no longer moves, the recorded
    # sample equals the rule's expression over the scraped summary at the same instant.
    stamp, queue_p99 = prometheus.last_sample(RECORDED, load_run.settled)
    assert stamp > at
    served = f'max by (model) (nv_inference_queue_summary_us{{quantile="0.99", model="{MODEL}"}})'
    log.info("queue p99 µs: recorded %.1f (request p50 %.1f, p99 %.1f)", queue_p99, p50, p99)
    assert 0 < queue_p99 == prometheus.value(served, stamp)


def test_prometheus_adapter_queries_give_the_servers_queue_time(
    prometheus: Prometheus, load_run: LoadRun, triton: Triton
) -> None:
    """The adapter's metricsQuery templates, filled in as the adapter does for one pod (here: the
    scrape target), return the server's mean queue time over the load and a pending-requests gauge."""
    rules = yaml.safe_load((K8S / "prometheus-adapter" / "values.yaml").read_text())["rules"]["custom"]
    by_name = {rule["name"]["as"]: rule for rule in rules}
    target = f'job="triton", instance="127.0.0.1:{triton.metrics_port}"'

    def fill(rule: dict[str, Any]) -> str:
        series = rule["seriesQuery"].split("{")[0]
        return (
            rule["metricsQuery"]
            .replace("<<.Series>>", series)
            .replace("<<.LabelMatchers>>", target)
            .replace("<<.GroupBy>>", "instance")
        )

    at = load_run.end - 1
    queue_us = prometheus.value(fill(by_name["triton_queue_time_us_per_request"]), at)
    log.info("adapter queue µs/request: %.1f", queue_us)
    # The adapter's window is a whole minute: the server's figure over the requests scraped in it.
    first, last = prometheus.window_edges(f'nv_inference_request_success{{model="{MODEL}"}}', at, 60)
    server = load_run.after_requests(last) - load_run.after_requests(first)
    assert queue_us == pytest.approx(server.queue_ns / 1000 / server.requests, rel=0.10)
    # Requests in the server now: a whole number, at most one per closed-loop client, and not always
    # none while they send.
    pending_query = fill(by_name["triton_pending_requests"])
    pending = prometheus.value(pending_query, at)
    assert pending == int(pending) and 0 <= pending <= CLIENTS
    busiest = prometheus.value(f"max_over_time(({pending_query})[{WINDOW_S}s:1s])", at)
    log.info("pending requests: %d now, %d at most over the window", pending, busiest)
    assert 1 <= busiest <= CLIENTS


def test_every_dashboard_query_runs(prometheus: Prometheus, load_run: LoadRun) -> None:
    board = json.loads((MONITORING / "grafana" / "triton-dashboard.json").read_text())
    for panel in board["panels"]:
        for target in panel["targets"]:
            result = prometheus.query(target["expr"].replace("$model", ".*"), load_run.end)
            if "DCGM" not in target["expr"] and "dcgm" not in target["expr"]:
                assert result, f"panel {panel['title']!r}: {target['expr']} returned nothing"


def test_unloading_a_model_fires_model_not_ready(
    prometheus: Prometheus, triton: Triton, load_run: LoadRun
) -> None:
    def not_ready() -> list[dict[str, Any]]:
        return [a for a in prometheus.alerts() if a["labels"]["alertname"] == "TritonModelNotReady"]

    assert not not_ready(), "TritonModelNotReady fired while every model was loaded"
    client = http.InferenceServerClient(triton.http_url)
    with pytest.raises(InferenceServerException, match="restricted"):  # the admin APIs are keyed
        client.unload_model(SPARE)
    client.unload_model(SPARE, headers=admin.headers(TEST_ADMIN_KEY))
    alerts = _wait(
        lambda: [a for a in not_ready() if a["state"] == "firing"], 45, "TritonModelNotReady to fire"
    )
    assert [a["labels"]["model"] for a in alerts] == [SPARE]
    assert alerts[0]["labels"]["instance"] == f"127.0.0.1:{triton.metrics_port}"
    # The server itself is still up and serving the other model.
    assert http.InferenceServerClient(triton.http_url).is_model_ready(MODEL)


def test_the_container_entry_point_supervises_tritonserver_and_answers_the_probes(triton: Triton) -> None:
    """``server.container`` runs tritonserver as its child (SIGTERM is passed on: the last test) and
    answers the pod's probes on its own port."""
    assert Path(triton.argv[0].decode()).name == "tritonserver"
    assert (
        b"--metrics-config=summary_latencies=true" in triton.argv and b"--exit-timeout-secs=5" in triton.argv
    )
    ready = _get_json(f"http://127.0.0.1:{triton.probe_port}/ready")
    assert ready["ready"] is True and ready["supervisor"]["state"] == "serving", ready
    assert _get_json(f"http://127.0.0.1:{triton.probe_port}/live")["live"] is True


def _pending(triton: Triton, model: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{triton.metrics_port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("nv_inference_pending_request_count") and f'model="{model}"' in line
    )


def test_sigterm_lets_in_flight_requests_finish(triton: Triton) -> None:
    """What a rollout relies on (runs last: it stops the server). A request waiting in the batcher
    when SIGTERM reaches the pid Kubernetes signals (the supervisor, which passes it on) still gets its
    answer, and the server then exits by itself (at the latest when its exit timeout, 5 s here,
    expires: connections this module's clients keep alive hold it that long)."""
    data = np.arange(16, dtype=np.float32).reshape(1, 16)
    outcome: dict[str, Any] = {}

    def send() -> None:
        tensor = http.InferInput("x", [1, 16], "FP32")
        tensor.set_data_from_numpy(data)
        try:
            outcome["y"] = http.InferenceServerClient(triton.http_url).infer(SLOW, [tensor]).as_numpy("y")
        except InferenceServerException as error:
            outcome["error"] = error

    sender = threading.Thread(target=send)
    sender.start()
    _wait(lambda: _pending(triton, SLOW) > 0, 10, "the request to be pending", interval=0.02)
    triton.process.send_signal(signal.SIGTERM)
    sender.join(timeout=60)
    assert "error" not in outcome, f"in-flight request failed on SIGTERM: {outcome.get('error')}"
    np.testing.assert_allclose(outcome["y"], 2 * data)
    try:  # a hang guard, not a stopwatch: a server that ignores SIGTERM fails here
        triton.process.wait(timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the server still running 120 s after SIGTERM:\n{triton.log_path.read_text()[-3000:]}")
