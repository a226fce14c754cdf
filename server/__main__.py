"""``python -m server start|stop|status``: the background server behind ``make serve`` / ``make stop``.

``start`` launches tritonserver in its own session, waits until it is ready, and records pid, ports and
log path in ``.run/server.json`` so ``stop`` and ``status`` (and the client's defaults) can find it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from server.launcher import ServerError, ServerOptions, TritonServer, remove_shm_regions

STATE = Path(".run/server.json")


def _start(args: argparse.Namespace) -> int:
    if STATE.exists() and _alive(json.loads(STATE.read_text())["pid"]):
        print(f"already running: {STATE.read_text()}", file=sys.stderr)
        return 1
    options = ServerOptions(
        repository=args.repository,
        host=args.host,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        model_control_mode=args.model_control_mode,
        log_path=Path(".run/server.log").resolve(),
        workdir=Path(".run/server").resolve(),
        http_guard=args.http_guard,  # Triton 2.51's HTTP frontend crashes on some inputs (README)
    )
    server = TritonServer(options)
    try:
        server.start(detach=True)
    except ServerError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    state = {
        "pid": server.pid,
        "http": server.http_url,
        "grpc": server.grpc_url,
        "metrics": server.metrics_url,
        "log": str(server.log_path),
        "repository": str(Path(args.repository).resolve()),
        "shm_prefix": server.shm_prefix,
    }
    STATE.parent.mkdir(exist_ok=True)
    STATE.write_text(json.dumps(state, indent=2))
    print(f"tritonserver ready: http {server.http_url}  grpc {server.grpc_url}  metrics {server.metrics_url}")
    if server.failed_models:
        count = len(server.failed_models)
        print(f"WARNING: {count} model(s) failed to load; the others serve:", file=sys.stderr)
        print(server.describe_failures(), file=sys.stderr)
    print(f"log: {server.log_path}   stop with: make stop")
    return 0


def _alive(pid: int) -> bool:
    """Is ``pid`` still our tritonserver? A recorded pid may have been reused after a crash or reboot."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"tritonserver" in command


def _stop(args: argparse.Namespace) -> int:
    if not STATE.exists():
        print("no server started by `make serve` is recorded")
        return 0
    state = json.loads(STATE.read_text())
    pid = state["pid"]
    if _alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + args.timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
        print(f"stopped tritonserver (pid {pid})")
    else:
        print(f"recorded tritonserver (pid {pid}) is no longer running; clearing its record")
    remove_shm_regions(state.get("shm_prefix", "tb-none-"))
    STATE.unlink()
    return 0


def _status(args: argparse.Namespace) -> int:
    if not STATE.exists() or not _alive(json.loads(STATE.read_text())["pid"]):
        print("not running")
        return 1
    state = json.loads(STATE.read_text())
    import tritonclient.http as http

    client = http.InferenceServerClient(state["http"])
    models = client.get_model_repository_index()
    print(json.dumps(state, indent=2))
    for model in models:
        print(f"  {model['name']:24} {model.get('state', '?'):10} {model.get('reason', '')}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m server", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="start tritonserver in the background and wait until ready")
    start.add_argument("--repository", type=Path, default=Path("model_repository"))
    start.add_argument(
        "--host", default="127.0.0.1", help="bind address (Triton 2.51 has CVEs: keep it local)"
    )
    start.add_argument("--http-port", type=int, default=8000)
    start.add_argument("--grpc-port", type=int, default=8001)
    start.add_argument("--metrics-port", type=int, default=8002)
    start.add_argument("--model-control-mode", choices=("none", "explicit"), default="none")
    start.add_argument(
        "--http-guard",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="put server.http_guard in front of Triton's HTTP port (default; see README: Bad input)",
    )
    stop = sub.add_parser("stop", help="SIGTERM the recorded server, SIGKILL after --timeout")
    stop.add_argument("--timeout", type=float, default=35.0)
    sub.add_parser("status", help="is the recorded server up; which models")
    args = parser.parse_args(argv)
    return {"start": _start, "stop": _stop, "status": _status}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
