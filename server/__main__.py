"""``python -m server start|stop|status|drain|load|unload|watch``: the server behind ``make serve``.

``start`` launches tritonserver in its own session, waits until it is ready, starts the stub watchdog
(``watch``, a detached process), and records pid, ports, log path and watchdog in ``.run/server.json``
so ``stop`` and ``status`` (and the client's defaults) can find it. The admin key for the restricted
APIs is in ``.run/admin.key`` (0600). Only one ``start`` runs per checkout at a time (a lock file).
``stop`` drains first (see ``server.admin.drain``); ``drain`` alone is the Kubernetes preStop step.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from server import admin
from server.cli_options import add_server_arguments, server_options
from server.launcher import ServerError, TritonServer, remove_shm_regions
from server.stubs import kill_stray_stubs
from server.watchdog import Watchdog

STATE = Path(".run/server.json")
LOCK = Path(".run/server.lock")
KEY = Path(".run/admin.key")
EVENTS = Path(".run/watchdog.json")


def _take_lock():
    """An exclusive lock on ``.run/server.lock`` for the whole start, or None if another start holds it."""
    LOCK.parent.mkdir(exist_ok=True)
    handle = open(LOCK, "a+")  # noqa: SIM115 (held until this process exits or releases it)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip() or "?"
        handle.close()
        return None, holder
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle, ""


def _start(args: argparse.Namespace) -> int:
    lock, holder = _take_lock()
    if lock is None:
        print(
            f"error: another `python -m server start` (pid {holder}) is starting a server from this "
            "checkout; wait for it, or `make stop`",
            file=sys.stderr,
        )
        return 1
    if STATE.exists() and _alive(json.loads(STATE.read_text())["pid"]):
        print(f"already running: {STATE.read_text()}", file=sys.stderr)
        return 1
    if STATE.exists():  # a server that died without `make stop`: clear what it left behind
        _clear_leftovers(json.loads(STATE.read_text()))
    options = server_options(
        args,
        log_path=Path(".run/server.log").resolve(),
        workdir=Path(".run/server").resolve(),
        self_heal=False,  # the watchdog runs as its own process, outliving this command
        port_wait_s=10.0,  # a server stopped a moment ago may still hold its ports
        http_guard=args.http_guard,  # Triton 2.51's HTTP frontend crashes on some inputs (README)
    )
    server = TritonServer(options)
    try:
        server.start(detach=True)
    except ServerError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    admin.write_key(KEY, server.admin_key)
    watcher = subprocess.Popen(
        [sys.executable, "-m", "server", "watch", "--pid", str(server.pid), "--http", server.triton_http_url],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=open(Path(".run/watchdog.log"), "ab"),  # noqa: SIM115 (inherited by the child)
        start_new_session=True,
    )
    state = {
        "pid": server.pid,
        "http": server.http_url,
        "triton_http": server.triton_http_url,  # Triton itself (behind the HTTP guard): admin calls
        "grpc": server.grpc_url,
        "metrics": server.metrics_url,
        "log": str(server.log_path),
        "repository": str(Path(args.repository).resolve()),
        "shm_prefix": server.shm_prefix,
        "model_control_mode": args.model_control_mode,
        "watchdog_pid": watcher.pid,
        "guard_pid": server.guard.pid if server.guard is not None else None,
        "watchdog_events": str(EVENTS.resolve()),
    }
    STATE.parent.mkdir(exist_ok=True)
    STATE.write_text(json.dumps(state, indent=2))
    print(f"tritonserver ready: http {server.http_url}  grpc {server.grpc_url}  metrics {server.metrics_url}")
    if server.failed_models:
        count = len(server.failed_models)
        print(f"WARNING: {count} model(s) failed to load; the others serve:", file=sys.stderr)
        print(server.describe_failures(), file=sys.stderr)
    print(f"log: {server.log_path}   stop with: make stop   admin key: {KEY}")
    return 0


def _clear_leftovers(state: dict) -> None:
    """Stubs and shared memory of a recorded server that is gone (killed, crashed)."""
    kill_stray_stubs(state.get("shm_prefix", "tb-none-"))
    remove_shm_regions(state.get("shm_prefix", "tb-none-"))
    _stop_watchdog(state)


def _alive(pid: int) -> bool:
    """Is ``pid`` still our tritonserver? A recorded pid may have been reused after a crash or reboot."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"tritonserver" in command


def _terminate(pid: int | None, marker: bytes, wait_s: float = 0.0) -> None:
    """SIGTERM ``pid`` if its command line still holds ``marker`` (a recorded pid may be reused)."""
    if not pid:
        return
    try:
        if marker not in Path(f"/proc/{pid}/cmdline").read_bytes():
            return
        os.kill(pid, signal.SIGTERM)
    except OSError:
        return
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.1)


def _stop_watchdog(state: dict) -> None:
    _terminate(state.get("watchdog_pid"), b"server")


def _drain(state: dict, timeout: float) -> int:
    key = admin.read_key(KEY)
    if key is None:
        print(f"no admin key at {KEY}; cannot drain", file=sys.stderr)
        return 1
    try:
        drained = admin.drain(_admin_url(state), key, timeout, state["pid"])
    except (admin.AdminError, InferenceServerException, OSError) as error:
        print(f"drain incomplete: {error}", file=sys.stderr)
        return 1
    print(f"drained: {', '.join(drained) or 'nothing was loaded'}; new requests are refused")
    return 0


def _admin_url(state: dict) -> str:
    """Triton's own HTTP endpoint: admin calls do not go through the HTTP guard."""
    return state.get("triton_http", state["http"])


def _running_state() -> dict | None:
    """The recorded server's state while it is running; None (and says so) otherwise."""
    if not STATE.exists() or not _alive(json.loads(STATE.read_text())["pid"]):
        print("not running")
        return None
    return json.loads(STATE.read_text())


def _drain_command(args: argparse.Namespace) -> int:
    state = _running_state()
    if state is None:
        return 1
    _stop_watchdog(state)
    return _drain(state, args.timeout)


def _stop(args: argparse.Namespace) -> int:
    if not STATE.exists():
        print("no server started by `make serve` is recorded")
        return 0
    state = json.loads(STATE.read_text())
    pid = state["pid"]
    _stop_watchdog(state)
    if _alive(pid):
        _drain(state, args.timeout)
        # the guard's kept-alive upstream connections would hold Triton's exit for its exit timeout
        _terminate(state.get("guard_pid"), b"http_guard", wait_s=10)
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + args.timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
        print(f"stopped tritonserver (pid {pid})")
    else:
        print(f"recorded tritonserver (pid {pid}) is no longer running; clearing its record")
    kill_stray_stubs(state.get("shm_prefix", "tb-none-"))
    remove_shm_regions(state.get("shm_prefix", "tb-none-"))
    STATE.unlink()
    return 0


def _status(args: argparse.Namespace) -> int:
    state = _running_state()
    if state is None:
        return 1
    client = httpclient.InferenceServerClient(_admin_url(state))
    models = client.get_model_repository_index(headers=admin.headers(admin.read_key(KEY) or ""))
    print(json.dumps(state, indent=2))
    for model in models:
        print(f"  {model['name']:24} {model.get('state', '?'):10} {model.get('reason', '')}")
    return 0


def _recorded_admin(args: argparse.Namespace) -> tuple[dict, str] | None:
    state = _running_state()
    if state is None:
        return None
    if state.get("model_control_mode") != "explicit":
        print("the server runs with --model-control-mode none: its model set is fixed", file=sys.stderr)
        return None
    return state, admin.read_key(KEY) or ""


def _load(args: argparse.Namespace) -> int:
    recorded = _recorded_admin(args)
    if recorded is None:
        return 1
    state, key = recorded
    client = httpclient.InferenceServerClient(_admin_url(state), network_timeout=600)
    files = {f"file:{Path(f).name}": Path(f).read_bytes() for f in args.file or []}
    try:
        allow = args.allow_file_override
        print(admin.load_model(client, key, args.model, files=files, allow_file_override=allow))
    except admin.AdminError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


def _unload(args: argparse.Namespace) -> int:
    recorded = _recorded_admin(args)
    if recorded is None:
        return 1
    state, key = recorded
    httpclient.InferenceServerClient(_admin_url(state)).unload_model(args.model, headers=admin.headers(key))
    print(f"unloading {args.model}")
    return 0


def _watch(args: argparse.Namespace) -> int:
    """The watchdog process of ``make serve``: runs until the server exits or SIGTERM."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    key = admin.read_key(KEY)
    if key is None:
        return 1
    watchdog = Watchdog(args.pid, args.http, key, EVENTS.resolve())
    signal.signal(signal.SIGTERM, lambda *_: watchdog.stop())
    watchdog.run()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m server", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="start tritonserver in the background and wait until ready")
    add_server_arguments(
        start, Path("model_repository"), "127.0.0.1", "bind address (Triton 2.51 has CVEs: keep it local)"
    )
    start.add_argument(
        "--http-guard",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="put server.http_guard in front of Triton's HTTP port (default; see README: Bad input)",
    )
    stop = sub.add_parser("stop", help="SIGTERM the recorded server, SIGKILL after --timeout")
    stop.add_argument("--timeout", type=float, default=35.0)
    sub.add_parser("status", help="is the recorded server up; which models")
    drain = sub.add_parser("drain", help="stop admitting requests, let admitted ones finish (preStop)")
    drain.add_argument("--timeout", type=float, default=30.0)
    load = sub.add_parser("load", help="load or reload a model (explicit mode), with the admin key")
    load.add_argument("model")
    load.add_argument("--file", action="append", help="file override (refused unless allowed)")
    load.add_argument("--allow-file-override", action="store_true", help="allow code sent in the request")
    unload = sub.add_parser("unload", help="unload a model (explicit mode), with the admin key")
    unload.add_argument("model")
    watch = sub.add_parser("watch", help="(internal) the stub watchdog process behind make serve")
    watch.add_argument("--pid", type=int, required=True)
    watch.add_argument("--http", required=True)
    args = parser.parse_args(argv)
    handlers = {
        "start": _start,
        "stop": _stop,
        "status": _status,
        "drain": _drain_command,
        "load": _load,
        "unload": _unload,
        "watch": _watch,
    }
    return handlers[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
