"""Self-healing: bring a model back when one of its Python-backend stubs dies.

Triton 2.51 does not restart a dead stub: every request to that instance gets 500 "Stub process ... is
not healthy" for good while the model still reports READY. The watchdog looks at the server's child
processes twice a second (no inference traffic, no model-specific probes): a stub that has exited while
its model is READY, no live stub serves the same instance and the model has fewer live stubs than its
config has instances is dead (a load with fewer instances retires stubs on purpose). It then reloads
that model through the keyed model-repository API with the model's own config plus a changed
``watchdog_reload`` parameter (Triton skips a load whose config is unchanged), removes the dead stub's
shared-memory region, and records the event in a JSON file that ``python -m client health`` shows.

Runs as a thread beside ``TritonServer`` and as the ``python -m server watch`` process behind
``make serve``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import tritonclient.http as httpclient

from server.admin import AdminError, load_model, model_versions
from server.stubs import Stub, server_stubs

log = logging.getLogger(__name__)


@dataclass
class HealEvent:
    model: str
    instance: str
    stub_pid: int
    died_at: float  # when the watchdog first saw it dead (epoch seconds)
    healed_at: float | None = None
    error: str = ""


@dataclass
class WatchdogState:
    events: list[HealEvent] = field(default_factory=list)
    dead_now: dict[str, str] = field(default_factory=dict)  # model -> instance, not yet healed

    def to_json(self) -> str:
        return json.dumps(
            {"events": [asdict(e) for e in self.events], "dead_now": self.dead_now, "written": time.time()},
            indent=2,
        )


class Watchdog:
    """Watches one server's stubs and reloads a model whose stub died; ``start()`` / ``stop()``."""

    def __init__(
        self,
        server_pid: int,
        http_url: str,
        admin_key: str,
        events_path: Path | None,
        interval_s: float = 0.5,
    ) -> None:
        self.server_pid, self.http_url, self.admin_key = server_pid, http_url, admin_key
        self.events_path, self.interval_s = events_path, interval_s
        self.state = WatchdogState()
        self._known: dict[int, Stub] = {}  # live stubs seen, by pid (a zombie has lost its argv)
        self._live: list[Stub] = []  # the live stubs of the latest poll
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Watchdog:
        self.dead_stubs()  # learn the live stubs now, so a death right after start is seen
        self._thread = threading.Thread(target=self.run, name="stub-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def run(self) -> None:
        self._write()
        if not self._known:
            self.dead_stubs()
        while not self._stop.wait(self.interval_s):
            if not Path(f"/proc/{self.server_pid}").exists():
                return
            try:
                self.check_once()
            except Exception:  # the watchdog must outlive any one bad poll; it logs and carries on
                log.exception("watchdog poll failed")

    def dead_stubs(self) -> list[Stub]:
        """Stubs seen alive earlier that are gone now, whose instance no live stub serves."""
        current = {s.pid: s for s in server_stubs(self.server_pid)}
        live_instances = {s.instance for s in current.values() if s.alive}
        self._live = [s for s in current.values() if s.alive]
        dead = []
        for pid, stub in list(self._known.items()):
            now = current.get(pid)
            if now is not None and now.alive:
                continue
            del self._known[pid]
            if stub.instance not in live_instances:
                dead.append(stub)
        self._known.update({pid: s for pid, s in current.items() if s.alive})
        return dead

    def check_once(self) -> list[HealEvent]:
        dead = self.dead_stubs()
        if not dead:
            return []
        client = httpclient.InferenceServerClient(self.http_url, network_timeout=120)
        states = model_versions(client, self.admin_key)
        healed = []
        for model in sorted({s.model for s in dead}):
            serving = {v.version for v in states.get(model, []) if v.state == "READY"}
            # Only a stub of a serving version matters: stubs of a model being unloaded, of a version
            # that failed to load, or the short-lived config auto-complete stub (instance name = model
            # name) exit on purpose.
            stubs = [s for s in dead if s.model == model and s.version in serving and s.instance != model]
            if not stubs or self._retired(client, model, serving):
                continue
            event = HealEvent(model, ",".join(s.instance for s in stubs), stubs[0].pid, died_at=time.time())
            self.state.events.append(event)
            self.state.dead_now[model] = event.instance
            self._write()
            log.warning("stub of %s (pid %s) died; reloading the model", event.instance, event.stub_pid)
            try:
                load_model(client, self.admin_key, model, config=self._reload_config(client, model))
                event.healed_at = time.time()
                log.warning("%s reloaded in %.1f s", model, event.healed_at - event.died_at)
            except (AdminError, Exception) as error:  # recorded and retried on the next stub death
                event.error = str(error)
                log.error("reloading %s failed: %s", model, error)
            for stub in stubs:
                Path("/dev/shm", stub.shm_region).unlink(missing_ok=True)
            self.state.dead_now.pop(model, None)
            self._write()
            healed.append(event)
        return healed

    def _retired(self, client: httpclient.InferenceServerClient, model: str, serving: set[str]) -> bool:
        """True when the model's live stubs are as many as its config asks for: the stubs that exited
        were retired by a load with fewer instances (e.g. ×2 → ×1 through the repository API), not
        killed. Without this rule the watchdog reloaded a model the user had just scaled down."""
        live = sum(1 for s in self._live if s.model == model and s.version in serving and s.instance != model)
        try:
            groups = client.get_model_config(model).get("instance_group", [])
        except Exception:  # no config to compare with: treat the exit as a death, as before
            return False
        wanted = sum(int(g.get("count", 1)) * max(1, len(g.get("gpus", []))) for g in groups)
        if wanted and live >= wanted * len(serving):
            log.info(
                "%s: %d live stubs serve its %d configured instances; an exit was a retirement",
                model,
                live,
                wanted,
            )
            return True
        return False

    def _reload_config(self, client: httpclient.InferenceServerClient, model: str) -> dict:
        """The model's config with a changed ``watchdog_reload`` parameter: Triton skips a load whose
        config equals the loaded one, so this makes it build new instances (and stubs)."""
        config = client.get_model_config(model)
        parameters = config.setdefault("parameters", {})
        parameters["watchdog_reload"] = {"string_value": str(len(self.state.events))}
        return config

    def _write(self) -> None:
        if self.events_path is None:
            return
        self.events_path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.events_path.with_suffix(".tmp")
        temporary.write_text(self.state.to_json())
        temporary.replace(self.events_path)


def read_events(path: Path) -> dict:
    """The watchdog's record (``{"events": [...], "dead_now": {...}}``), empty if there is none."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
