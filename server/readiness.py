"""The supervisor's probe endpoints for Kubernetes (``server.container``): ``/ready`` and ``/live``.

Triton 2.51's ``/v2/health/ready`` says 200 while a model's stub is dead or hung, and nothing answers
while the supervisor restarts a dead server. ``/ready`` is 200 only while the supervisor serves, Triton
is ready and the watchdog holds no model unavailable; ``/live`` is 200 while the supervisor supervises
(a restart is the cure, not a reason to kill the container). JSON bodies with the supervisor's record.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from server.supervisor import SERVING, Supervisor

log = logging.getLogger(__name__)


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
    except (urllib.error.URLError, OSError) as error:
        return False, f"tritonserver does not answer: {error}"
    return False, "tritonserver is not ready"


class ProbeEndpoint:
    """``/ready`` and ``/live`` on ``host:port`` in a thread of the supervisor's process."""

    def __init__(self, supervisor: Supervisor, host: str, port: int) -> None:
        self.supervisor = supervisor
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, body = endpoint.answer(self.path)
                payload = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:  # a probe every few seconds: no access log
                pass

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="probes", daemon=True)

    def answer(self, path: str) -> tuple[int, dict]:
        record = asdict(self.supervisor.record)
        if path == "/live":
            return 200, {"live": True, "supervisor": record}
        if path == "/ready":
            ready, why = readiness(self.supervisor)
            return (200 if ready else 503), {"ready": ready, "why": why, "supervisor": record}
        return 404, {"error": f"no such probe {path!r}: /ready or /live"}

    def start(self) -> ProbeEndpoint:
        self._thread.start()
        log.info("probes on %s:%s: /ready /live", *self.httpd.server_address[:2])
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
