"""``python -m server start|stop|status|drain|load|unload``: the server behind ``make serve``, one per
checkout, its state in ``.run/``. ``start`` runs a detached supervisor and returns once it reports the
server ready; ``stop`` and ``drain`` (the Kubernetes preStop step) release the supervisor first, so
nothing restarts the server they stop."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from server import admin
from server.cli_options import (
    add_front_timeout_arguments,
    add_server_arguments,
    front_timeouts,
    server_options,
)
from server.config_drift import config_drift
from server.fronts.process import add_share_arguments, shares_from_args
from server.launcher import ServerError, ServerOptions, TritonServer, remove_shm_regions
from server.records import read_record, warmup_snapshot, write_record
from server.stubs import kill_stray_stubs
from server.supervisor import Supervisor, record_lines
from server.triton_exit import exit_timeout_explained
from server.watchdog import event_lines

STATE = Path(".run/server.json")
LOCK = Path(".run/server.lock")
KEY = Path(".run/admin.key")
EVENTS = Path(".run/watchdog.json")
SUPERVISOR = Path(".run/supervisor.json")
SUPERVISOR_LOG = Path(".run/supervisor.log")
STARTUP_MARGIN_S = 60.0  # beyond the server's own startup timeout, for the supervisor to report
LOG_END_BYTES = 1 << 16  # where tritonserver's last words are, at the end of its log


def _take_lock():
    """An exclusive lock on ``.run/server.lock`` for the whole start, or None and the holder's pid."""
    LOCK.parent.mkdir(exist_ok=True)
    handle = open(LOCK, "a+")  # noqa: SIM115 (held until this process exits or releases it)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip() or "?"
        handle.close()
        return None, holder
    handle.truncate(0)
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
    if STATE.exists():
        state = json.loads(STATE.read_text())
        if _runs(state["pid"], b"tritonserver") or _runs(state.get("supervisor_pid"), b"supervise"):
            print(_already_running(state), file=sys.stderr)
            return 1
        _clear_leftovers(state)  # a server that died without `make stop`
    SUPERVISOR_LOG.parent.mkdir(exist_ok=True)
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "server", "supervise", *args.flags],  # the same server flags
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=open(SUPERVISOR_LOG, "ab"),  # noqa: SIM115 (inherited by the child)
        start_new_session=True,
    )
    report = _first_report(supervisor, args.startup_timeout + STARTUP_MARGIN_S)
    if not report.get("ready"):
        print(f"error: {report.get('error', 'the supervisor said nothing')}", file=sys.stderr)
        return 1
    failed = report.get("failed_models", [])
    if failed and not args.allow_partial:
        print(report["failed"], file=sys.stderr)
        _stop(argparse.Namespace(timeout=35.0))
        print(
            f"error: {len(failed)} model(s) failed to load: {', '.join(failed)} "
            f"(reasons above; the server is stopped). Fix them, or serve the others with "
            "`make serve ALLOW_PARTIAL=1` (python -m server start --allow-partial)",
            file=sys.stderr,
        )
        return 1
    print(f"tritonserver ready: http {report['http']}  grpc {report['grpc']}  metrics {report['metrics']}")
    if failed:
        print(f"WARNING: {len(failed)} model(s) failed to load; the others serve:", file=sys.stderr)
        print(report["failed"], file=sys.stderr)
    print(f"log: {report['log']}   stop with: make stop   admin key: {KEY}")
    return 0


def _already_running(state: dict) -> str:
    return (
        f"error: this checkout already runs a server (tritonserver pid {state['pid']}, supervisor pid "
        f"{state.get('supervisor_pid')}, http {state['http']}, grpc {state['grpc']}, repository "
        f"{state.get('repository')}); one server per checkout: stop it first with `make stop`"
    )


def _first_report(supervisor: subprocess.Popen, timeout_s: float) -> dict:
    """The supervisor's one-line JSON report of its first start (or why it has none)."""
    assert supervisor.stdout is not None
    ready, _, _ = select.select([supervisor.stdout], [], [], timeout_s)
    line = supervisor.stdout.readline() if ready else b""
    supervisor.stdout.close()
    if line:
        return json.loads(line)
    if supervisor.poll() is None:
        supervisor.terminate()
        return {"error": f"the supervisor did not report within {timeout_s:.0f} s (see {SUPERVISOR_LOG})"}
    tail = SUPERVISOR_LOG.read_text(errors="replace").splitlines()[-20:]
    return {"error": f"the supervisor exited with {supervisor.wait()}:\n" + "\n".join(tail)}


def supervised_options(args: argparse.Namespace) -> ServerOptions:
    """The ``ServerOptions`` of the server ``supervise`` runs, from the flags ``start`` was given."""
    return server_options(
        args,
        log_path=Path(".run/server.log").resolve(),
        workdir=Path(".run/server").resolve(),
        port_wait_s=10.0,  # a server stopped a moment ago may still hold its ports
        http_front=args.http_front,
        grpc_front=args.grpc_front,
        watchdog_record=EVENTS.resolve(),
        front_shares=shares_from_args(args, "front-"),
        **front_timeouts(args),
    )


def _supervise(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    server = TritonServer(supervised_options(args))
    supervisor = Supervisor(server, SUPERVISOR.resolve(), on_serving=lambda s: _record_state(s, args))
    supervisor.handle_signals()
    try:
        supervisor.start()
    except ServerError as error:
        _report({"ready": False, "error": str(error)})
        return 1
    _report(
        {
            "ready": True,
            "http": server.http_url,
            "grpc": server.grpc_url,
            "metrics": server.metrics_url,
            "log": str(server.log_path),
            "failed_models": sorted(server.failed_models),
            "failed": server.describe_failures(),
        }
    )
    return supervisor.run()


def _report(report: dict) -> None:
    """One JSON line to ``start`` on stdout; stdout then points nowhere (``start`` has exited)."""
    with contextlib.suppress(BrokenPipeError):  # ``start`` gave up waiting and closed its end
        sys.stdout.write(json.dumps(report) + "\n")
        sys.stdout.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _record_state(server: TritonServer, args: argparse.Namespace) -> None:
    """``.run/server.json`` and the admin key for the server now running (after each restart too)."""
    admin.write_key(KEY, server.admin_key)
    state = {
        "pid": server.pid,
        "http": server.http_url,
        "triton_http": server.triton_http_url,  # Triton itself, behind the front: admin calls go there
        "grpc": server.grpc_url,
        "metrics": server.metrics_url,
        "log": str(server.log_path),
        "repository": str(Path(args.repository).resolve()),
        "spec": str(Path(args.spec).resolve()) if args.spec else None,  # `client infer`'s default
        "shm_prefix": server.shm_prefix,
        "model_control_mode": args.model_control_mode,
        "supervisor_pid": os.getpid(),
        "http_front_pid": server.http_front.pid if server.http_front is not None else None,
        "triton_grpc": server.triton_grpc_url,
        "grpc_front_pid": server.grpc_front.pid if server.grpc_front is not None else None,
        "config_changes": str(server.config_changes_file),  # loads and unloads name their model there
        "warmup": warmup_snapshot(server.triton_http_url),
    }
    write_record(STATE, state)


def _clear_leftovers(state: dict) -> None:
    kill_stray_stubs(state.get("shm_prefix", "tb-none-"))
    remove_shm_regions(state.get("shm_prefix", "tb-none-"))


def _runs(pid: int | None, marker: bytes) -> bool:
    """Does ``pid`` still run a command holding ``marker`` (a recorded pid may have been reused)?"""
    try:
        return bool(pid) and marker in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _signal(pid: int | None, marker: bytes, number: int = signal.SIGTERM, wait_s: float = 0.0) -> None:
    """Send ``number`` to ``pid`` if it still runs ``marker``; wait up to ``wait_s`` for it to exit."""
    if not _runs(pid, marker):
        return
    with contextlib.suppress(OSError):
        os.kill(pid, number)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and _runs(pid, marker):
        time.sleep(0.1)


def _release_supervisor(state: dict, wait_s: float) -> None:
    """End supervision (SIGUSR1) and wait for the supervisor to exit: nothing restarts the server after
    this (a half-started one is stopped)."""
    pid = state.get("supervisor_pid")
    _signal(pid, b"supervise", signal.SIGUSR1, wait_s)
    _signal(pid, b"supervise")  # still there: it had hung


def _drain(state: dict, timeout: float) -> int:
    key = admin.read_key(KEY)
    if key is None:
        print(f"no admin key at {KEY}; cannot drain", file=sys.stderr)
        return 1
    try:
        drained = admin.drain(state["triton_http"], key, timeout, state["pid"])
    except (admin.AdminError, InferenceServerException, OSError) as error:
        print(f"drain incomplete: {error}", file=sys.stderr)
        return 1
    print(f"drained: {', '.join(drained) or 'nothing was loaded'}; new requests are refused")
    return 0


def _running_state() -> dict | None:
    """The recorded server's state while it is running; None (and says so) otherwise."""
    state = read_record(STATE)
    if not state or not _runs(state["pid"], b"tritonserver"):
        print("not running")
        return None
    return state


def _drain_command(args: argparse.Namespace) -> int:
    state = _running_state()
    if state is None:
        return 1
    _release_supervisor(state, wait_s=args.timeout + 30)
    return _drain(state, args.timeout)


def _stop(args: argparse.Namespace) -> int:
    if not STATE.exists():
        print("no server started by `make serve` is recorded")
        return 0
    _release_supervisor(read_record(STATE), wait_s=args.timeout + 30)
    state = read_record(STATE)  # a restart in progress may have recorded a new server
    pid = state["pid"]
    if _runs(pid, b"tritonserver"):
        _drain(state, args.timeout)
        # the fronts' kept-alive upstream connections would hold Triton's exit
        for front in ("http_front", "grpc_front"):
            _signal(state.get(f"{front}_pid"), front.encode(), wait_s=10)
        _signal(pid, b"tritonserver", wait_s=args.timeout)
        _signal(pid, b"tritonserver", signal.SIGKILL)  # still there after its timeout
        print(f"stopped tritonserver (pid {pid})")
        ended = exit_timeout_explained(_log_end(state))
        if ended is not None:  # its exit status went to whoever adopted it: the log says what it was
            print(ended)
    else:
        print(f"recorded tritonserver (pid {pid}) is no longer running; clearing its record")
    _clear_leftovers(state)
    STATE.unlink()
    return 0


def _log_end(state: dict) -> str:
    """The end of the recorded server's log ("" if there is none)."""
    try:
        with open(state.get("log", ""), "rb") as log_file:
            log_file.seek(max(0, log_file.seek(0, os.SEEK_END) - LOG_END_BYTES))
            return log_file.read().decode(errors="replace")
    except OSError:
        return ""


def _record_shown(state: dict) -> str:
    """The server's record as ``status`` prints it: the warm-up's statistics (a page per model, for
    ``client stats`` to subtract) are one line saying which models they cover."""
    shown = {key: value for key, value in state.items() if key != "warmup"}
    warmed = ", ".join(sorted(state.get("warmup") or {})) or "none"
    return f"{json.dumps(shown, indent=2)}\nwarm-up recorded (client stats subtracts it): {warmed}"


def _status(args: argparse.Namespace) -> int:
    state = read_record(STATE)
    if not state:
        print("not running")
        return 1
    running = _runs(state["pid"], b"tritonserver")
    print(_record_shown(state))
    if running:
        client = httpclient.InferenceServerClient(state["triton_http"])
        models = client.get_model_repository_index(headers=admin.headers(admin.read_key(KEY) or ""))
        width = max((len(model["name"]) for model in models), default=0)  # the states in one column
        for model in models:
            print(f"  {model['name']:{width}} {model.get('state', '?'):10} {model.get('reason', '')}")
            served = client.get_model_config(model["name"]) if model.get("state") == "READY" else None
            if served and (drift := config_drift(Path(state["repository"]), model["name"], served)):
                print(f"  {'':{width}} {drift}")
    elif _runs(state.get("supervisor_pid"), b"supervise"):
        print("tritonserver is down; the supervisor is restarting it")
    else:
        print("not running")
    print("\n".join([*record_lines(read_record(SUPERVISOR)), *event_lines(read_record(EVENTS))]))
    return 0 if running else 1


def _load_or_unload(args: argparse.Namespace) -> int:
    state = _running_state()
    if state is None:
        return 1
    if state.get("model_control_mode") != "explicit":
        print("the server runs with --model-control-mode none: its model set is fixed", file=sys.stderr)
        return 1
    key = admin.read_key(KEY) or ""
    client = httpclient.InferenceServerClient(state["triton_http"], network_timeout=600)
    # the fronts check the model's next request against the config Triton serves then (row 79)
    changes = Path(state["config_changes"]) if state.get("config_changes") else None
    if args.command == "unload":
        admin.unload_model(client, key, args.model, changes)
        print(f"unloading {args.model}")
        return 0
    files = {f"file:{Path(f).name}": Path(f).read_bytes() for f in args.file or []}
    try:
        allow = args.allow_file_override
        print(
            admin.load_model(client, key, args.model, files=files, allow_file_override=allow, changes=changes)
        )
    except admin.AdminError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


def _add_start_arguments(parser: argparse.ArgumentParser, host_help: str) -> None:
    """``start``'s flags, passed on as given to the ``supervise`` process."""
    add_server_arguments(parser, Path("model_repository"), "127.0.0.1", host_help, startup_timeout=180.0)
    add_share_arguments(parser, prefix="front-")  # the fronts' deadline and client shares
    add_front_timeout_arguments(parser)
    parser.add_argument(
        "--model-control-mode",
        choices=("none", "explicit"),
        default="none",
        help="none: the model set stays as loaded at start (`python -m server load`/`unload` refuse); "
        "explicit: they load and unload models with the admin key. Triton itself runs in explicit mode "
        "either way, for the drain and the stub watchdog",
    )
    for front, port in (("http", "HTTP"), ("grpc", "gRPC")):
        parser.add_argument(
            f"--{front}-front",
            action=argparse.BooleanOptionalAction,
            default=True,
            help=f"put server.fronts.{front}_front before Triton's {port} port (default; docs/SERVING.md)",
        )
    parser.add_argument(
        "--allow-partial",
        action="store_true",
        help="keep serving when some models fail to load (default: name them, stop, exit 1)",
    )
    parser.add_argument(
        "--spec", type=Path, help="the spec the repository was built from (read by `client infer`)"
    )


def command_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m server", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="start tritonserver in the background and wait until ready")
    _add_start_arguments(start, "bind address (Triton 2.51 has CVEs: keep it local)")
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
    supervise = sub.add_parser("supervise", help="(internal) the supervisor process behind make serve")
    _add_start_arguments(supervise, "bind address")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = command_parser().parse_args(argv)
    args.flags = (sys.argv[1:] if argv is None else argv)[1:]  # the command's own flags, after its name
    handlers = {
        "start": _start,
        "stop": _stop,
        "status": _status,
        "drain": _drain_command,
        "load": _load_or_unload,
        "unload": _load_or_unload,
        "supervise": _supervise,
    }
    return handlers[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
