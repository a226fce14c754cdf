"""Keep one tritonserver running: restart it on the same ``TritonServer`` (ports, admin key, region
prefix, watchdog history) when it dies, as systemd's ``Restart=on-failure`` does, while the fronts answer
503 / ``UNAVAILABLE`` (row 46). SIGTERM/SIGINT stop it, SIGUSR1 releases it running (docs/SERVING.md)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from server.install import ServerError
from server.launcher import TritonServer
from server.records import write_record

log = logging.getLogger(__name__)
STARTING, SERVING, RESTARTING = "starting", "serving", "restarting"
STOPPED, GAVE_UP, RELEASED = "stopped", "gave up", "released"
POLL_S = 0.2
# lines of a dying server's log that say why: C++ aborts, Triton's own signal handler
CAUSE_MARKERS = ("terminate called", "what():", "Signal (", "Segmentation fault", "Aborted")


@dataclass(frozen=True)
class RestartPolicy:
    """``Restart=on-failure`` with systemd's knobs, in seconds."""

    first_delay_s: float = 1.0  # RestartSec
    max_delay_s: float = 30.0  # RestartMaxDelaySec
    burst: int = 5  # StartLimitBurst
    interval_s: float = 300.0  # StartLimitIntervalSec

    def recent(self, restarts: list[float], now: float) -> int:
        return sum(1 for moment in restarts if now - moment < self.interval_s)

    def delay(self, restarts: list[float], now: float) -> float:
        return min(self.max_delay_s, self.first_delay_s * 2 ** self.recent(restarts, now))

    def exhausted(self, restarts: list[float], now: float) -> bool:
        return self.recent(restarts, now) >= self.burst


def death_cause(returncode: int, log_tail: str) -> str:
    """Why a server exited, for people: its signal or status, and the log line that explains it."""
    if returncode < 0:
        try:
            what = f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            what = f"killed by signal {-returncode}"
    else:
        what = f"exited with status {returncode}"
    reasons = [line.strip() for line in log_tail.splitlines() if any(m in line for m in CAUSE_MARKERS)]
    return f"{what}: {reasons[0][:200]}" if reasons else what


@dataclass
class SupervisorRecord:
    """What the supervisor has done, as ``status`` and ``client health`` show it."""

    supervisor_pid: int
    state: str = STARTING
    server_pid: int | None = None
    restarts: int = 0
    last_cause: str = ""
    last_death_at: float | None = None  # epoch seconds
    serving_again_at: float | None = None
    history: list[dict] = field(default_factory=list)  # every death: cause, when, serving again when


def record_lines(record: dict) -> list[str]:
    """The record as ``status`` and ``client health`` print it."""
    if not record:
        return []
    state = record.get("state", "?")
    if not record.get("restarts") and not record.get("last_cause"):
        return [f"  supervisor (pid {record.get('supervisor_pid')}): {state}, no restart"]
    death = record.get("last_death_at")
    died = time.strftime("%H:%M:%S", time.localtime(death)) if death else "?"
    line = (
        f"  supervisor (pid {record.get('supervisor_pid')}): {state}; tritonserver restarted "
        f"{record.get('restarts', 0)} time(s); last death at {died}: {record.get('last_cause', '?')}"
    )
    again = record.get("serving_again_at")
    if again and death and again >= death:
        line += f"; serving again after {again - death:.1f} s"
    return [line]


class _Interrupted(BaseException):
    """A signal arrived while a server was starting: that start is abandoned (and its server stopped)."""


class Supervisor:
    """Runs ``server`` and restarts it when it dies; ``run()`` blocks until stopped or given up."""

    def __init__(
        self,
        server: TritonServer,
        record_path: Path | None,
        policy: RestartPolicy = RestartPolicy(),
        on_serving: Callable[[TritonServer], None] = lambda server: None,
        stop_server: Callable[[TritonServer], None] = TritonServer.stop,
    ) -> None:
        self.server, self.record_path, self.policy = server, record_path, policy
        self.on_serving, self.stop_server = on_serving, stop_server
        self.record = SupervisorRecord(supervisor_pid=os.getpid())
        self._restarts: list[float] = []  # monotonic times of restarts, for the start limit
        self._wanted: str | None = None  # STOPPED or RELEASED once a signal asked for it
        self._starting = False

    def handle_signals(self) -> None:
        """SIGTERM/SIGINT stop, SIGUSR1 releases (main thread only)."""
        for number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(number, lambda *_: self._request(STOPPED))
        signal.signal(signal.SIGUSR1, lambda *_: self._request(RELEASED))

    def _request(self, what: str) -> None:
        self._wanted = what
        if self._starting:
            raise _Interrupted(what)

    def release(self) -> None:
        """From another thread: end supervision after the current step; the server keeps running."""
        self._wanted = RELEASED

    def start(self) -> None:
        """The first start; its failure (``ServerError``) is the caller's to report, never retried."""
        try:
            self._start()
        except _Interrupted as signalled:
            raise ServerError(f"start abandoned: {signalled} asked for while the server started") from None
        self._write()

    def _start(self) -> None:
        """Start the server unless a signal asked otherwise; the record (not yet written) says it serves."""
        self._starting = True
        try:
            if self._wanted is None:
                self.server.start()
        finally:
            self._starting = False
        if self._wanted is None:
            self.on_serving(self.server)
        self.record.state, self.record.server_pid = SERVING, self.server.pid

    def run(self) -> int:
        """Supervise until stopped (0), released (0) or the start limit is hit (1)."""
        try:
            while self._wanted is None:
                process = self.server.process
                if process is None or process.poll() is None:
                    time.sleep(POLL_S)
                    continue
                if process.returncode == 0:
                    log.warning("tritonserver exited with status 0: stopped on purpose, not restarted")
                    self.server.reap()
                    self.server.stop_fronts()
                    self._write(STOPPED)
                    return 0
                if not self._restart(process.returncode):
                    return 1
        except _Interrupted:
            pass  # the half-started server was stopped by TritonServer.start itself
        return self._finish()

    def _restart(self, returncode: int) -> bool:
        """Clean up after the dead server and start it again after the backoff; False once given up."""
        cause = death_cause(returncode, self.server.log_tail(60))
        now = time.time()
        log.error("tritonserver (pid %s) %s", self.server.pid, cause)
        self.server.reap()  # the fronts stay, answering 503 / UNAVAILABLE until the restarted server serves
        log_path = self.server.log_path
        with contextlib.suppress(OSError):  # kept as <log>.1: the restarted server writes a new one
            log_path.replace(log_path.with_name(log_path.name + ".1"))
        self.record.last_cause, self.record.last_death_at = cause, now
        self.record.history.append({"died_at": now, "pid": self.server.pid, "cause": cause})
        while True:
            moment = time.monotonic()
            if self.policy.exhausted(self._restarts, moment):
                limit = (self.policy.burst, self.policy.interval_s)
                log.error("%d restarts within %.0f s: giving up (the start limit)", *limit)
                self.server.stop_fronts()
                self._write(GAVE_UP)
                return False
            delay = self.policy.delay(self._restarts, moment)
            self._write(RESTARTING)
            log.warning("restarting tritonserver in %.1f s", delay)
            self._sleep(delay)
            if self._wanted is not None:
                return True
            self._restarts.append(time.monotonic())
            self.record.restarts += 1
            self._write()
            try:
                self._start()
            except ServerError as error:
                log.error("restart failed: %s", error)
                self.record.last_cause = f"restart failed: {str(error).splitlines()[0][:200]}"
                self.server.reap()
                continue
            self.record.serving_again_at = time.time()
            self.record.history[-1]["serving_again_at"] = self.record.serving_again_at
            self._write()
            log.warning("tritonserver serving again (pid %s)", self.server.pid)
            return True

    def _finish(self) -> int:
        """What a signal asked for: stop the server, or leave it running."""
        if self._wanted == STOPPED:
            self.stop_server(self.server)
        elif self.server.watchdog is not None:
            self.server.watchdog.stop()
        self._write(STOPPED if self._wanted == STOPPED else RELEASED)
        return 0

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self._wanted is None and time.monotonic() < deadline:
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))

    def _write(self, state: str | None = None) -> None:
        self.record.state = state or self.record.state
        if self.record_path is not None:
            write_record(self.record_path, asdict(self.record))
