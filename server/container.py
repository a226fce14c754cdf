"""``python -m server.container``: the server image's entry point (deploy/Dockerfile): the supervisor in
the foreground on all interfaces, the log on stdout, and probes on ``--probe-port`` because 2.51's
``/v2/health/ready`` says 200 while a stub is dead or hung (docs/DEPLOY.md)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import urllib.request
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from server.cli_options import add_server_arguments, server_options
from server.install import ServerError
from server.launcher import TritonServer
from server.supervisor import SERVING, Supervisor

log = logging.getLogger(__name__)

ADMIN_KEY_ENV = "TRITON_ADMIN_KEY"
METRICS_ARGS = ["--metrics-config=summary_latencies=true"]


def readiness(supervisor: Supervisor) -> tuple[bool, str]:
    """Whether the supervised server can serve every model now, and if not, why."""
    server = supervisor.server
    if supervisor.record.state != SERVING:
        return False, f"tritonserver is {supervisor.record.state}"
    if server.process is None or server.process.poll() is not None:
        return False, "tritonserver is not running"
    if server.watchdog is not None and server.watchdog.state.unavailable_now:
        reasons = "; ".join(f"{m}: {why}" for m, why in sorted(server.watchdog.state.unavailable_now.items()))
        return False, f"models unavailable until the watchdog has reloaded them: {reasons}"
    try:
        with urllib.request.urlopen(f"http://{server.triton_http_url}/v2/health/ready", timeout=2) as answer:
            if answer.status == 200:
                return True, "serving"
    except OSError as error:  # urllib's errors included
        return False, f"tritonserver does not answer: {error}"
    return False, "tritonserver is not ready"


def probe_answer(supervisor: Supervisor, path: str) -> tuple[int, dict]:
    record = asdict(supervisor.record)
    if path == "/live":
        return 200, {"live": True, "supervisor": record}
    if path == "/ready":
        ready, why = readiness(supervisor)
        return (200 if ready else 503), {"ready": ready, "why": why, "supervisor": record}
    return 404, {"error": f"no such probe {path!r}: /ready or /live"}


def serve_probes(supervisor: Supervisor, host: str, port: int) -> ThreadingHTTPServer:
    """``/ready`` and ``/live`` on ``host:port``, served by a thread of the supervisor's process."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = probe_answer(supervisor, self.path)
            payload = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:  # a probe every few seconds: no access log
            pass

    httpd = ThreadingHTTPServer((host, port), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, name="probes", daemon=True).start()
    log.info("probes on %s:%s: /ready /live", *httpd.server_address[:2])
    return httpd


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m server.container", description=__doc__)
    host_help = "bind address: all interfaces, so the Service and probes reach it"
    add_server_arguments(parser, Path("/models"), "0.0.0.0", host_help, startup_timeout=600.0)
    parser.add_argument(
        "--exit-timeout",
        type=int,
        default=int(os.environ.get("EXIT_TIMEOUT_SECS", "30")),
        help="seconds to finish in-flight requests after SIGTERM (env EXIT_TIMEOUT_SECS)",
    )
    parser.add_argument(
        "--workdir", type=Path, default=Path("/tmp/triton"), help="backend folder (a writable volume)"
    )
    parser.add_argument("--probe-port", type=int, default=8003, help="/ready and /live for the pod's probes")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    server = TritonServer(
        server_options(
            args,
            exit_timeout_s=args.exit_timeout,
            workdir=args.workdir,
            log_path=args.workdir / "server.log",
            echo_log=True,
            extra_args=METRICS_ARGS,
            port_wait_s=10.0,  # a restart may find the dead server's ports still held for a moment
            admin_key=os.environ.get(ADMIN_KEY_ENV) or None,  # a Secret's key, or a random one
        )
    )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    supervisor = Supervisor(server, args.workdir / "supervisor.json", stop_server=TritonServer.terminate)
    supervisor.handle_signals()
    probes = serve_probes(supervisor, args.host, args.probe_port)
    try:
        supervisor.start()
    except ServerError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    try:
        return supervisor.run()
    finally:
        probes.shutdown()
        probes.server_close()


if __name__ == "__main__":
    sys.exit(main())
