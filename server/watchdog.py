"""Self-healing: Triton 2.51 never restarts a dead stub (its instance answers 500 while the model says
READY) and aborts once a stub it gave up on resumes. So the watchdog reads the stubs from ``/proc`` four
times a second, kills a hung one (stopped, silent, or stuck by the metrics), reloads the model of a dead
one through the keyed repository API, and records each event for ``python -m client health``."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

import tritonclient.http as httpclient

from server.admin import load_model, serving_versions
from server.proc_stat import running, stop
from server.records import write_record
from server.stubs import Stub, StubScan, activity, owned_mutexes

log = logging.getLogger(__name__)
DIED = "died"
POLL_S = 0.25  # stubs read from /proc this often: a silent one is seen inside Triton's 1 s health window
SILENT_AFTER_S = 0.7  # judged at the first poll after this: 0.75-1.0 s after a stub's last run
STOP_WAIT_S = 0.1  # how long a running hung stub may take to stop before its mutexes are read anyway
RELEASE_TRIES = 50  # a stopped stub owning a pool mutex is let run this many times (1 ms each) to release it
KILL_WAIT_S = 5.0  # how long a killed hung stub may take to exit before the reload starts anyway
STUCK_AFTER_S = 10.0  # requests waiting and nothing finished for this long: the model's stubs are stuck
PROGRESS_EVERY_S = 1.0  # how often the metrics are read for that
METRIC = re.compile(r'^(nv_inference_\w+)\{[^}]*model="([^"]+)"[^}]*\}\s+([0-9.eE+-]+)$')
PROGRESS = ("nv_inference_exec_count", "nv_inference_request_success", "nv_inference_request_failure")
PENDING = "nv_inference_pending_request_count"


def model_progress(metrics_text: str) -> dict[str, tuple[float, float]]:
    """Per model, from Triton's metrics: (requests waiting, executions + successes + failures so far)."""
    found: dict[str, list[float]] = {}
    for match in filter(None, map(METRIC.match, metrics_text.splitlines())):
        name, model, value = match.group(1), match.group(2), float(match.group(3))
        totals = found.setdefault(model, [0.0, 0.0])
        if name == PENDING:
            totals[0] += value
        elif name in PROGRESS:
            totals[1] += value
    return {model: (pending, done) for model, (pending, done) in found.items()}


@dataclass
class HealEvent:
    model: str
    instance: str
    stub_pid: int
    detected_at: float  # epoch seconds
    healed_at: float | None = None
    error: str = ""
    cause: str = DIED  # or why a live stub was taken for hung: "stopped, state T", ...
    server_pid: int = 0  # the tritonserver whose stub it was (a restarted server's watchdog keeps the events)


def what_happened(cause: str) -> str:
    """What happened to a stub, for people: "died", or "hung (why), killed"."""
    return cause if cause == DIED else f"hung ({cause}), killed"


@dataclass
class WatchdogState:
    events: list[HealEvent] = field(default_factory=list)
    unavailable_now: dict[str, str] = field(default_factory=dict)  # model -> why, until it is healed


class Watchdog:
    """Watches one server's stubs; each reload runs in a thread of its own (10 s or more), so a stub
    that stops meanwhile is still killed within a poll or two."""

    def __init__(
        self,
        server_pid: int,
        http_url: str,
        admin_key: str,
        events_path: Path | None,
        state: WatchdogState | None = None,
        metrics_url: str | None = None,
    ) -> None:
        self.server_pid, self.http_url, self.admin_key = server_pid, http_url, admin_key
        self.events_path, self.metrics_url = events_path, metrics_url
        self._progress: dict[str, tuple[float, float]] = {}  # model -> (progress count, monotonic since)
        self._progress_read_at = 0.0
        self.state = state or WatchdogState()  # a restarted server's watchdog keeps the history
        self._scan = StubScan(server_pid)  # the server's stubs, read from /proc at each call
        self._known: dict[int, Stub] = {}  # live stubs seen, by pid (a zombie has lost its argv)
        self._live: list[Stub] = []  # the live stubs of the latest poll
        self._activity: dict[int, tuple[int, float]] = {}  # pid -> (activity, monotonic time it last changed)
        self._killed: dict[int, HealEvent] = {}  # hung stubs killed, by pid, until their model is reloaded
        self._waiting: dict[str, list[Stub]] = {}  # dead stubs of a model whose reload is in flight
        self._reloads: dict[str, threading.Thread] = {}  # model -> its reload in flight
        self._lock = threading.Lock()  # the state and its file, shared with the reload threads
        self._stop = threading.Event()
        self._server_gone_said = False
        self._thread: threading.Thread | None = None

    @property
    def reloads(self) -> int:
        """The heal events on this server, not inherited ones: they bound the versions Triton 2.51 holds
        past a drain (``server.triton_exit``)."""
        return sum(1 for event in self.state.events if event.server_pid == self.server_pid)

    def start(self) -> Watchdog:
        self.dead_stubs()  # learn the live stubs now, so a death right after start is seen
        self._thread = threading.Thread(target=self.run, name="stub-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        for reload in list(self._reloads.values()):
            reload.join(timeout=30)

    def run(self) -> None:
        self._write()
        while not self._stop.wait(POLL_S):
            try:
                self.check_once()
            except Exception:  # the watchdog must outlive any one bad poll; it logs and carries on
                log.exception("watchdog poll failed")

    def dead_stubs(self, scan: list[Stub] | None = None) -> list[Stub]:
        """Stubs seen alive earlier that are gone now, whose instance no live stub serves."""
        self._live = [s for s in (self._scan() if scan is None else scan) if s.alive]
        seen, self._known = self._known, {s.pid: s for s in self._live}
        live_instances = {s.instance for s in self._live}
        return [s for pid, s in seen.items() if pid not in self._known and s.instance not in live_instances]

    def hung_stubs(self, scan: list[Stub]) -> list[tuple[Stub, str]]:
        """Live stubs of ``scan`` that cannot answer, each with why: stopped, silent, or stuck."""
        now = time.monotonic()
        hung: dict[int, tuple[Stub, str]] = {}  # by pid: a stub judged twice counts once, as first judged
        live = [s for s in scan if s.alive]
        self._activity = {s.pid: self._activity[s.pid] for s in live if s.pid in self._activity}
        for stub in live:
            if stub.stopped:
                hung[stub.pid] = (stub, f"stopped, state {stub.state}")
                continue
            count = activity(stub.pid)
            seen = self._activity.get(stub.pid)
            if count is None or seen is None or seen[0] != count:
                self._activity[stub.pid] = (count or 0, now)
            elif now - seen[1] >= SILENT_AFTER_S:
                hung[stub.pid] = (stub, f"no thread ran for {now - seen[1]:.1f} s")
        for model, cause in self.stuck_models(live).items():
            for stub in (s for s in live if s.model == model and s.instance != model):
                hung.setdefault(stub.pid, (stub, cause))
        return list(hung.values())

    def stuck_models(self, live: list[Stub]) -> dict[str, str]:
        """Models with live stubs whose waiting requests have not moved for ``STUCK_AFTER_S``, with why."""
        now = time.monotonic()
        if self.metrics_url is None or now - self._progress_read_at < PROGRESS_EVERY_S:
            return {}
        self._progress_read_at = now
        try:
            with urllib.request.urlopen(self.metrics_url, timeout=2) as answer:
                progress = model_progress(answer.read().decode(errors="replace"))
        except OSError:  # urllib's errors included
            return {}  # no metrics this time: nothing is judged on missing data
        stuck = {}
        for model in {s.model for s in live}:
            pending, done = progress.get(model, (0.0, 0.0))
            seen = self._progress.get(model)
            if pending <= 0 or seen is None or seen[0] != done:
                self._progress[model] = (done, now)
            elif now - seen[1] >= STUCK_AFTER_S:
                stuck[model] = f"{pending:.0f} requests waited {now - seen[1]:.0f} s and none finished"
                self._progress[model] = (done, now)  # judged once; its reload starts the clock again
        return stuck

    def _release_mutexes(self, stub: Stub) -> None:
        """Let a stopped stub run a millisecond at a time until it owns no pool mutex: killed owning one,
        it leaves it owner-died and the server aborts (``server.stubs.owned_mutexes``)."""
        held: list[int] = []
        for _ in range(RELEASE_TRIES):
            held = owned_mutexes(stub.pid, stub.shm_region)
            if not held:
                return
            try:
                os.kill(stub.pid, signal.SIGCONT)
                time.sleep(0.001)
                stop(stub.pid, STOP_WAIT_S)  # every thread stopped before the next read
            except ProcessLookupError:
                return
        log.warning(
            "stub of %s (pid %s) still owns mutexes at %s; killing it anyway", stub.instance, stub.pid, held
        )

    def _stop_where_it_is(self, stub: Stub) -> None:
        """SIGSTOP every thread of a hung stub, so it owns the same mutexes when read as when killed (a
        frozen stub never reaches state T; it runs no code either way)."""
        with contextlib.suppress(ProcessLookupError):
            stop(stub.pid, STOP_WAIT_S)

    def _kill_hung(self, scan: list[Stub]) -> bool:
        """SIGKILL every hung stub before it can resume; its death is then healed like any other, under
        the event recorded here. True if it killed one."""
        killed = False
        for stub, cause in self.hung_stubs(scan):
            if not stub.stopped:
                self._stop_where_it_is(stub)
            self._release_mutexes(stub)
            try:
                os.kill(stub.pid, signal.SIGKILL)  # a stopped process dies too; it never runs again
            except ProcessLookupError:
                continue
            killed = True
            event = HealEvent(stub.model, stub.instance, stub.pid, time.time(), cause=cause)
            log.warning("stub of %s (pid %s) hung: %s; killed it", stub.instance, stub.pid, cause)
            with self._lock:
                self._killed[stub.pid] = event
                self._record(event, f"stub of {stub.instance} hung ({cause})")
        if killed:
            deadline = time.monotonic() + KILL_WAIT_S
            while time.monotonic() < deadline and any(
                s.pid in self._killed and s.alive for s in self._scan()
            ):
                time.sleep(0.05)
        return killed

    def check_once(self) -> list[str]:
        """One poll: kill hung stubs, find dead ones, start healing their models; the models it started."""
        if not running(self.server_pid):
            self._server_gone()
            return []
        scan = self._scan()
        if self._kill_hung(scan):
            scan = self._scan()  # the killed stubs are gone now: heal them in this poll
        for stub in self.dead_stubs(scan):
            self._waiting.setdefault(stub.model, []).append(stub)
        started = []
        for model in sorted(self._waiting):
            reload = self._reloads.get(model)
            if reload is not None and reload.is_alive():
                continue  # its stubs wait for the reload in flight to finish
            stubs = self._waiting.pop(model)
            thread = threading.Thread(target=self._heal, args=(model, stubs), daemon=True)
            self._reloads[model] = thread
            thread.start()
            started.append(model)
        return started

    def _heal(self, model: str, dead: list[Stub]) -> None:
        try:
            self._heal_model(model, dead)
        except Exception:  # a reload thread logs what went wrong; the next death starts another
            if running(self.server_pid):
                log.exception("healing %s failed", model)
            else:  # it died after this reload started: its stubs died with it, not on their own
                self._server_gone()

    def _server_gone(self) -> None:
        """tritonserver itself exited or was killed, and its stubs with it: nothing to reload (the
        supervisor starts another server, with a watchdog of its own). Said once, then the watchdog stops."""
        self._stop.set()
        with self._lock:
            said, self._server_gone_said = self._server_gone_said, True
        if not said:
            log.warning(
                "tritonserver (pid %s) is gone and its stubs with it; the watchdog stops", self.server_pid
            )

    def _heal_model(self, model: str, dead: list[Stub]) -> None:
        """Reload ``model`` if ``dead`` held stubs of a serving version that no live stub replaces."""
        client = httpclient.InferenceServerClient(self.http_url, network_timeout=120)
        serving = set(serving_versions(client, self.admin_key, model))
        # stubs of an unloaded or failed version, or the auto-complete stub (named as the model): on purpose
        stubs = [s for s in dead if s.version in serving and s.instance != model]
        if not stubs or self._retired(client, model, serving):
            self._forget_killed(model, [s.pid for s in dead])
            return
        with self._lock:
            event = next((self._killed.pop(s.pid) for s in stubs if s.pid in self._killed), None)
            if event is None:
                event = HealEvent(model, ",".join(s.instance for s in stubs), stubs[0].pid, time.time())
                self._record(event, f"stub of {event.instance} died")
        log.warning(
            "stub of %s (pid %s) %s; reloading", event.instance, event.stub_pid, what_happened(event.cause)
        )
        try:
            load_model(client, self.admin_key, model, config=self._reload_config(client, model))
            event.healed_at = time.time()
            log.warning("%s reloaded in %.1f s", model, event.healed_at - event.detected_at)
        except Exception as error:  # AdminError or any other: recorded, retried on the next stub death
            event.error = str(error)
            log.error("reloading %s failed: %s", model, error)
        for stub in stubs:
            Path("/dev/shm", stub.shm_region).unlink(missing_ok=True)
        with self._lock:
            self.state.unavailable_now.pop(model, None)
            self._write()

    def _record(self, event: HealEvent, why: str) -> None:
        """A new heal event on this server (the lock held); its model is unavailable until healed."""
        event.server_pid = self.server_pid
        self.state.events.append(event)
        self.state.unavailable_now[event.model] = why
        self._write()

    def _forget_killed(self, model: str, pids: list[int]) -> None:
        """Hung stubs were killed, but their model needs no reload (unloaded, or scaled down)."""
        with self._lock:
            for pid in pids:
                event = self._killed.pop(pid, None)
                if event is not None:
                    event.error = "not reloaded: that version of the model no longer served"
            still_killed = any(e.model == model for e in self._killed.values())
            if not still_killed and self.state.unavailable_now.pop(model, None) is not None:
                self._write()

    def _retired(self, client: httpclient.InferenceServerClient, model: str, serving: set[str]) -> bool:
        """True when the model's live stubs are as many as its config asks for: the stubs that exited
        were retired by a load with fewer instances, and a reload would undo the user's scale-down."""
        live = sum(1 for s in self._live if s.model == model and s.version in serving and s.instance != model)
        try:
            groups = client.get_model_config(model).get("instance_group", [])
        except Exception:  # no config to compare with: treat the exit as a death, as before
            return False
        wanted = sum(int(g.get("count", 1)) * max(1, len(g.get("gpus", []))) for g in groups)
        retired = bool(wanted) and live >= wanted * len(serving)
        if retired:
            log.info("%s: %d live stubs serve its %d instances: a retirement", model, live, wanted)
        return retired

    def _reload_config(self, client: httpclient.InferenceServerClient, model: str) -> dict:
        """The model's config with a changed ``watchdog_reload`` parameter, so Triton builds new stubs."""
        config = client.get_model_config(model)
        parameters = config.setdefault("parameters", {})
        parameters["watchdog_reload"] = {"string_value": str(len(self.state.events))}
        return config

    def _write(self) -> None:
        if self.events_path is not None:
            write_record(self.events_path, {**asdict(self.state), "written": time.time()})


def event_lines(events: dict) -> list[str]:
    """The record's events as ``client health`` and ``server status`` print them."""
    lines = []
    for event in events.get("events", []):
        seen = time.strftime("%H:%M:%S", time.localtime(event["detected_at"]))
        if event.get("healed_at"):
            outcome = f"reloaded in {event['healed_at'] - event['detected_at']:.1f} s"
        else:
            outcome = f"reload failed: {event['error']}" if event.get("error") else "reloading"
        what = what_happened(event.get("cause", DIED))
        stub = f"stub of {event['instance']} (pid {event['stub_pid']})"
        lines.append(f"  watchdog: {stub} {what} at {seen}; {outcome}")
    return lines
