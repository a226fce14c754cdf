"""The server's admin surface: the key for the restricted APIs, keyed model loads, and the drain.

With explicit model control any local process could load code, so the repository, trace, logging and
shared-memory APIs need ``ADMIN_HEADER``, and behind a front inference needs ``FRONT_HEADER``, which
the front adds once its checks pass: one secret under two names. Fronts read it from ``KEY_ENV``, never
their command line (readable in ``/proc``)."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from server.config_changes import mark_changed
from server.stubs import server_stubs

log = logging.getLogger(__name__)

ADMIN_HEADER = "triton-admin-key"
GRPC_ADMIN_HEADER = f"triton-grpc-protocol-{ADMIN_HEADER}"
RESTRICTED_APIS = ("model-repository", "trace", "logging")
FRONT_HEADER = "triton-front-key"
GRPC_FRONT_HEADER = f"triton-grpc-protocol-{FRONT_HEADER}"
FRONTED_APIS = ("inference",)
SHARED_MEMORY_API = "shared-memory"  # Triton's system and CUDA shared memory alike
KEY_ENV = "TRITON_BATCHING_ADMIN_KEY"


class AdminError(RuntimeError):
    """An admin operation was refused or failed; the message says which model and why."""


def restricted_api_args(
    key: str, http_front: bool, grpc_front: bool, trusted_shared_memory: bool
) -> list[str]:
    """tritonserver flags keying the restricted APIs on both protocols, and behind a front
    ``FRONTED_APIS`` to what the front passed on (module doc)."""
    args = []
    for flag, fronted in (("--http-restricted-api", http_front), ("--grpc-restricted-protocol", grpc_front)):
        admin_apis, fronted_apis = list(RESTRICTED_APIS), list(FRONTED_APIS)
        if not trusted_shared_memory:
            admin_apis.append(SHARED_MEMORY_API)
        elif fronted:
            fronted_apis.append(SHARED_MEMORY_API)
        if fronted:
            args.append(f"{flag}={','.join(fronted_apis)}:{FRONT_HEADER}={key}")
        args.append(f"{flag}={','.join(admin_apis)}:{ADMIN_HEADER}={key}")
    return args


def write_key(path: Path, key: str) -> None:
    """Write the key created 0600: never readable by others, not even for a moment."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as handle:
        handle.write(key)


def read_key(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def headers(key: str, protocol: str = "http") -> dict[str, str]:
    """The request headers that unlock every restricted API (gRPC metadata takes prefixed names)."""
    if protocol == "grpc":
        return {GRPC_ADMIN_HEADER: key, GRPC_FRONT_HEADER: key}
    return {ADMIN_HEADER: key, FRONT_HEADER: key}


def model_versions(client: httpclient.InferenceServerClient, key: str) -> dict[str, dict[str, str]]:
    """The repository index grouped by model: ``{model: {version: state}}``."""
    grouped: dict[str, dict[str, str]] = {}
    for entry in client.get_model_repository_index(headers=headers(key)):
        grouped.setdefault(entry["name"], {})[entry.get("version", "")] = entry.get("state", "")
    return grouped


def serving_versions(client: httpclient.InferenceServerClient, key: str, model: str) -> list[str]:
    versions = model_versions(client, key).get(model, {})
    return [version for version, state in versions.items() if state == "READY"]


def load_model(
    client: httpclient.InferenceServerClient,
    key: str,
    model: str,
    config: dict[str, Any] | None = None,
    files: dict[str, bytes] | None = None,
    allow_file_override: bool = False,
    changes: Path | None = None,
) -> str:
    """Load (or reload) ``model``; one line saying what serves afterwards (after a failure too). File
    overrides (code the server would run) are refused unless allowed. ``changes``: the server's
    ``config_changes_file``, where the fronts learn the config may have changed (fault matrix row 79)."""
    if files and not allow_file_override:
        raise AdminError(
            f"load of '{model}' with file overrides refused: they run code inside the server; "
            "pass allow_file_override=True (CLI: --allow-file-override) if that is intended"
        )
    try:
        config_text = json.dumps(config) if config is not None else None
        client.load_model(model, headers=headers(key), config=config_text, files=files)
    except InferenceServerException as error:
        serving = serving_versions(client, key, model)
        still = f"; version {', '.join(serving)} keeps serving" if serving else "; nothing serves it"
        raise AdminError(f"load of '{model}' failed: {error.message()}{still}") from error
    finally:  # whatever Triton answered: a load that failed or timed out here may still have replaced it
        if changes is not None:
            mark_changed(changes, model)
    return f"{model}: serving version {', '.join(serving_versions(client, key, model)) or '(none)'}"


def unload_model(
    client: httpclient.InferenceServerClient, key: str, model: str, changes: Path | None = None
) -> None:
    """Unload ``model``; ``changes`` as ``load_model``'s."""
    try:
        client.unload_model(model, headers=headers(key))
    finally:
        if changes is not None:
            mark_changed(changes, model)


def _ensembles_first(client: httpclient.InferenceServerClient, names: Iterable[str]) -> list[list[str]]:
    """Unload order: ensembles before the models they call, so no ensemble loses a step mid-request."""
    ensembles, others = [], []
    for name in names:
        try:
            platform = client.get_model_config(name).get("platform", "")
        except InferenceServerException:
            platform = ""
        (ensembles if platform == "ensemble" else others).append(name)
    return [group for group in (ensembles, others) if group]


def drain(http_url: str, key: str, timeout_s: float, server_pid: int) -> list[str]:
    """Unload every loaded model (returned), wait for its stubs to exit (``AdminError`` past ``timeout_s``):
    after SIGTERM Triton 2.51 admits requests for its whole exit timeout, then drops them, while an
    unload refuses new ones at once (404 / NOT_FOUND) and lets admitted ones finish."""
    client = httpclient.InferenceServerClient(http_url, connection_timeout=10, network_timeout=timeout_s)
    states = model_versions(client, key)
    loaded = [m for m, versions in states.items() if "READY" in versions.values()]
    deadline = time.monotonic() + timeout_s
    for group in _ensembles_first(client, loaded):
        for name in group:
            client.unload_model(name, headers=headers(key))
        while True:
            states = model_versions(client, key)
            busy = [m for m in group if {"READY", "UNLOADING"} & set(states.get(m, {}).values())]
            if not busy:
                break
            if time.monotonic() > deadline:
                raise AdminError(f"drain: {', '.join(busy)} still unloading after {timeout_s:.0f}s")
            time.sleep(0.1)
    while any(stub.alive for stub in server_stubs(server_pid)):
        if time.monotonic() > deadline:
            raise AdminError(f"drain: stubs of server {server_pid} still running after {timeout_s:.0f}s")
        time.sleep(0.1)
    log.info("drained: unloaded %s", ", ".join(loaded) or "nothing")
    return loaded
