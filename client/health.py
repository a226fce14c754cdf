"""``python -m client health``: whether the models can serve, not only whether the server answers. 2.51
says READY while a stub is dead or hung, so the watchdog's record decides; exit 0 only if every model
checked serves, so it can be a readiness probe."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from tritonclient.utils import InferenceServerException

from client.connection import model_config
from server.admin import headers
from server.config_drift import config_drift
from server.records import read_record
from server.supervisor import record_lines
from server.watchdog import event_lines


@dataclass
class ModelHealth:
    name: str
    serving: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # version -> first line of the reason
    unavailable: str = ""  # why a stub of it cannot answer until the watchdog has reloaded it
    drift: str = ""  # how the served config differs from config.pbtxt on disk (server.config_drift)

    @property
    def ok(self) -> bool:
        return bool(self.serving) and not self.unavailable

    def line(self) -> str:
        if self.unavailable:
            state = f"NOT SERVING: {self.unavailable}, the watchdog is reloading it"
        elif self.serving:
            state = f"READY (serving version {', '.join(self.serving)})"
        else:
            state = "NOT READY"
        for version, reason in sorted(self.failed.items()):
            state += f"; version {version} failed to load: {reason}"
        if self.drift:
            state += f"; {self.drift}"
        return f"  {self.name}: {state}"


def model_health(
    client: Any, protocol: str, models: list[str], key: str | None, events: dict
) -> list[ModelHealth]:
    """Health of ``models`` (all models the server knows when empty and the key is given)."""
    index: dict[str, ModelHealth] = {}
    if key:
        try:
            raw = client.get_model_repository_index(headers=headers(key, protocol))
        except InferenceServerException:  # another server's key (e.g. --url elsewhere): no version detail
            raw, key = [], None
        entries = raw if isinstance(raw, list) else json_format.MessageToDict(raw).get("models", [])
        for entry in entries:
            health = index.setdefault(entry["name"], ModelHealth(entry["name"]))
            if entry.get("state") == "READY":
                health.serving.append(entry.get("version", ""))
            elif entry.get("reason", "") not in ("", "unloaded"):
                health.failed[entry.get("version", "")] = entry["reason"].strip().splitlines()[0][:160]
    result = [index.get(name) or ModelHealth(name) for name in models or sorted(index)]
    for health in result:
        if not key and client.is_model_ready(health.name):
            health.serving = ["?"]
        health.unavailable = events.get("unavailable_now", {}).get(health.name, "")
    return result


def report(
    client: Any,
    protocol: str,
    models: list[str],
    key_path: Path | None,
    events_path: Path | None,
    supervisor_path: Path | None = None,
    repository: Path | None = None,
) -> tuple[str, bool]:
    """The text ``client health`` prints and whether everything checked can serve. The records are read
    first: the server's answers can take seconds while a model reloads, and by then the outage is over."""
    events = read_record(events_path) if events_path else {}
    supervisor = read_record(supervisor_path) if supervisor_path else {}
    down = []
    try:
        live, ready = client.is_server_live(), client.is_server_ready()
    except (InferenceServerException, OSError) as error:
        live, ready, down = False, False, [f"  server not reachable: {error}"]
    key = key_path.read_text().strip() if key_path and key_path.is_file() else None
    healths = model_health(client, protocol, models, key, events) if live else []
    for health in healths:  # a rebuild since the model loaded: reported, the model stays healthy
        if repository is not None and health.serving:
            health.drift = config_drift(repository, health.name, model_config(client, protocol, health.name))
    lines = [f"live: {live}  ready: {ready}", *down, *(h.line() for h in healths)]
    lines += [*record_lines(supervisor), *event_lines(events)]
    return "\n".join(lines), live and ready and all(h.ok for h in healths)
