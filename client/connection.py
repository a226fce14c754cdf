"""``--protocol`` and ``--url`` to a tritonclient client; defaults from ``make serve``'s record."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from client.errors import ClientError
from server.records import read_record

DEFAULT_URLS = {"http": "127.0.0.1:8000", "grpc": "127.0.0.1:8001"}
SERVER_STATE = Path(".run/server.json")


def recorded_path(key: str) -> Path | None:
    """The ``"repository"`` or ``"spec"`` ``make serve`` recorded; None where it recorded none."""
    recorded = read_record(SERVER_STATE).get(key)
    return Path(recorded) if recorded else None


def recorded_warmup(url: str | None) -> dict[str, dict[str, dict[str, Any]]] | None:
    """``{model: {version: statistics}}`` of the warm-up ``make serve`` recorded; None for another
    server (``url`` not the recorded one) or no record."""
    state = read_record(SERVER_STATE)
    if url is not None and url not in (state.get("http"), state.get("grpc")):
        return None
    return state.get("warmup")


def protocol_module(protocol: str) -> ModuleType:
    """``tritonclient.http`` or ``tritonclient.grpc``: both expose InferInput, InferRequestedOutput."""
    if protocol not in DEFAULT_URLS:
        raise ClientError(f"protocol must be http or grpc, got {protocol!r}")
    return httpclient if protocol == "http" else grpcclient


def connect(protocol: str, url: str | None = None) -> Any:
    module = protocol_module(protocol)
    return module.InferenceServerClient(
        url or read_record(SERVER_STATE).get(protocol) or DEFAULT_URLS[protocol]
    )


def model_config(client: Any, protocol: str, model: str) -> dict[str, Any]:
    """The model's config as a dict, the same shape for both protocols."""
    if protocol == "grpc":
        return client.get_model_config(model, as_json=True)["config"]
    return client.get_model_config(model)
