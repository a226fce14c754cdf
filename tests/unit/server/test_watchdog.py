"""What the watchdog reads from Triton's metrics to tell a stuck model from an idle or a busy one, and
how soon it judges a silent stub hung."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

from server import watchdog as watchdog_module
from server.ports import free_ports
from server.proc_stat import EXITED, stat_fields
from server.stubs import STOPPED_STATES, Stub
from server.watchdog import POLL_S, Watchdog, model_progress

HEALTH_WINDOW_S = 1.0  # Triton's give-up time for a stub mid-execute, hard-coded in 2.51

METRICS = """# HELP nv_inference_request_success Number of successful inference requests
nv_inference_request_success{model="sleepy",version="1"} 5
nv_inference_request_success{model="sleepy",version="2"} 1
nv_inference_request_failure{model="sleepy",reason="BACKEND",version="1"} 4
nv_inference_request_failure{model="sleepy",reason="REJECTED",version="1"} 0
nv_inference_exec_count{model="sleepy",version="1"} 7
nv_inference_pending_request_count{model="sleepy",version="1"} 3
nv_inference_pending_request_count{model="idle",version="1"} 0
nv_inference_exec_count{model="idle",version="1"} 12
nv_inference_queue_duration_us{model="sleepy",version="1"} 123456
nv_gpu_utilization{gpu_uuid="GPU-0"} 0.5
"""


def test_progress_sums_executions_successes_and_failures_over_versions_and_reasons() -> None:
    progress = model_progress(METRICS)
    assert progress == {"sleepy": (3.0, 5 + 1 + 4 + 7), "idle": (0.0, 12.0)}


def test_no_metrics_no_models() -> None:
    assert model_progress("") == {}
    assert model_progress('# only comments\nnv_gpu_utilization{gpu_uuid="GPU-0"} 1\n') == {}


def test_metrics_that_cannot_be_read_judge_no_model_stuck() -> None:
    """A metrics port that refuses (the server restarting, say) is no evidence: nothing is stuck."""
    (port,) = free_ports(["127.0.0.1"])
    watchdog = Watchdog(
        os.getpid(), "127.0.0.1:1", "key", None, metrics_url=f"http://127.0.0.1:{port}/metrics"
    )
    assert watchdog.stuck_models([]) == {}


def silent_stub(pid: int = 4242) -> Stub:
    return Stub(pid, "m", "1", "m_0_0", "region", alive=True, state="S")


def first_poll_judging_hung(monkeypatch: pytest.MonkeyPatch, counts: Callable[[int], int]) -> float | None:
    """Poll one stub every ``POLL_S`` for 3 s, its activity at poll k being ``counts(k)``; the time of
    the first poll that judges it hung, or None."""
    watchdog = Watchdog(os.getpid(), "127.0.0.1:1", "key", None)
    clock = {"now": 100.0, "poll": 0}
    monkeypatch.setattr(watchdog_module.time, "monotonic", lambda: clock["now"])
    monkeypatch.setattr(watchdog_module, "activity", lambda pid: counts(clock["poll"]))
    for poll in range(int(3 / POLL_S)):
        clock["now"], clock["poll"] = 100.0 + poll * POLL_S, poll
        if watchdog.hung_stubs([silent_stub()]):
            return poll * POLL_S
    return None


def test_a_silent_stub_is_judged_hung_before_triton_gives_up_on_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton 2.51 gives a stub one second to show a sign of life in the middle of an execute, then
    frees that batch's memory and the server dies when the stub resumes. The stub last ran at most one
    poll before the poll that saw its count last change, so the judgement must come inside the window
    counted from there."""
    judged_at = first_poll_judging_hung(monkeypatch, lambda poll: 7)  # never runs after the first poll
    assert judged_at is not None
    assert judged_at + POLL_S <= HEALTH_WINDOW_S


def test_a_stub_that_runs_between_polls_is_never_judged_hung(monkeypatch: pytest.MonkeyPatch) -> None:
    assert first_poll_judging_hung(monkeypatch, lambda poll: poll) is None


def test_a_running_hung_stub_is_stopped_before_its_mutexes_are_read() -> None:
    """A silent or stuck stub is not stopped yet: it must hold still while the watchdog reads which
    mutexes it owns, or it owns other ones by the time it is killed."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        Watchdog(os.getpid(), "127.0.0.1:1", "key", None)._stop_where_it_is(silent_stub(busy.pid))
        fields = stat_fields(busy.pid)
        assert fields is not None and fields[0] in STOPPED_STATES
    finally:
        busy.kill()
        busy.wait()


def test_a_restarted_servers_watchdog_counts_only_the_reloads_on_its_own_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The supervisor's restarted server gets a watchdog that keeps the events of the one before, for
    ``client health``; Triton 2.51 strands an old version only in the server whose stub died, so the
    drained server's count of them is bounded by its own watchdog's reloads (``make soak``)."""
    first = Watchdog(os.getpid(), "127.0.0.1:1", "key", None)
    restarted = Watchdog(os.getppid(), "127.0.0.1:1", "key", None, state=first.state)
    for watchdog in (first, first, restarted):
        hung = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            monkeypatch.setattr(
                watchdog, "hung_stubs", lambda scan, pid=hung.pid: [(silent_stub(pid), "silent")]
            )
            assert watchdog._kill_hung([])
        finally:
            hung.kill()
            hung.wait()
    assert len(first.state.events) == 3
    assert (first.reloads, restarted.reloads) == (2, 1)


@pytest.fixture
def killed_server() -> Iterator[subprocess.Popen]:
    """A process killed and not yet reaped, as tritonserver is right after a ``kill -9`` until its
    supervisor waits for it; nothing listens on its port any more."""
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    server.kill()
    while (fields := stat_fields(server.pid)) is not None and fields[0] not in EXITED:
        time.sleep(0.01)
    yield server
    server.wait()


def test_stubs_that_died_with_their_server_are_one_line_and_no_reload(
    killed_server: subprocess.Popen, caplog: pytest.LogCaptureFixture
) -> None:
    """After a ``kill -9`` of tritonserver its stubs die with it before the supervisor has reaped it:
    the watchdog says once that the server is gone and reloads nothing (before: a reload per model,
    each failing with a ``ConnectionRefusedError`` traceback)."""
    (port,) = free_ports(["127.0.0.1"])
    watchdog = Watchdog(killed_server.pid, f"127.0.0.1:{port}", "key", None)
    watchdog.dead_stubs([silent_stub(4242), Stub(4243, "n", "1", "n_0_0", "region", alive=True)])
    with caplog.at_level(logging.INFO, logger=watchdog_module.__name__):
        started = watchdog.check_once()
        watchdog.check_once()
        watchdog.stop()  # waits for any reload it started
    assert started == []
    assert [(r.levelname, r.getMessage(), r.exc_info) for r in caplog.records] == [
        (
            "WARNING",
            f"tritonserver (pid {killed_server.pid}) is gone and its stubs with it; the watchdog stops",
            None,
        )
    ]


def test_a_reload_the_server_died_under_is_the_same_one_line(
    killed_server: subprocess.Popen, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server killed after the watchdog began reloading its models: each reload fails on the refused
    connection, and the watchdog tells that from a failed reload by the server being gone."""

    def refused(*args: object) -> list[str]:
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(watchdog_module, "serving_versions", refused)
    watchdog = Watchdog(killed_server.pid, "127.0.0.1:1", "key", None)
    with caplog.at_level(logging.INFO, logger=watchdog_module.__name__):
        for model in ("m", "n"):
            watchdog._heal(model, [silent_stub()])
    assert [(r.levelname, r.exc_info) for r in caplog.records] == [("WARNING", None)]
    assert "is gone" in caplog.records[0].getMessage()
