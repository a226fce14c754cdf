"""``python -m server.container``: the entry point of this project's server image (deploy/Dockerfile).

It runs the supervisor (``server.supervisor``) in the foreground, as the container's main process:
tritonserver is its child, with the same command and environment as ``TritonServer`` (backend folder,
shared-memory sizing, ``PYTHONPATH`` and ``LD_LIBRARY_PATH`` for the wheel's server) and its log
copied to the container's stdout. A tritonserver that dies is restarted in place on the same ports
(faster than a container restart: the repository is already there), the stub watchdog heals dead and
hung stubs, and ``--probe-port`` answers the pod's probes (``/ready``, ``/live``: ``server.readiness``),
which, unlike Triton 2.51's own endpoints, say not ready while a model's stub is dead or hung.

SIGTERM (what Kubernetes sends after the preStop pause) goes on to tritonserver at once: it finishes
the requests in flight for up to ``--exit-timeout`` seconds and exits; the supervisor waits for it
(SIGKILL 5 s past the timeout), removes what it left behind and exits. The pod's
``terminationGracePeriodSeconds`` must exceed the preStop pause plus this timeout (checked by
tests/deploy/test_manifests.py).

Unlike ``make serve`` it binds all interfaces by default: inside a pod the Service and the kubelet's
probes must reach it. Network policy, not the bind address, limits who can.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from server.cli_options import add_server_arguments, server_options
from server.install import ServerError
from server.launcher import TritonServer
from server.readiness import ProbeEndpoint
from server.supervisor import Supervisor

ADMIN_KEY_ENV = "TRITON_ADMIN_KEY"
# Latency quantiles (p50/p90/p95/p99 per model) for the dashboard and the queue-time alert.
METRICS_ARGS = ["--metrics-config=summary_latencies=true"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m server.container", description=__doc__)
    add_server_arguments(
        parser, Path("/models"), "0.0.0.0", "bind address: all interfaces, so the Service and probes reach it"
    )
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
    parser.add_argument(
        "--startup-timeout", type=float, default=600.0, help="seconds a (re)start may take to be ready"
    )
    parser.add_argument("--print", action="store_true", help="print the command instead of running it")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not args.repository.is_dir():
        print(f"error: model repository {args.repository} does not exist", file=sys.stderr)
        return 1
    server = TritonServer(  # the pod's tritonserver, not started yet
        server_options(
            args,
            exit_timeout_s=args.exit_timeout,
            workdir=args.workdir,
            log_path=args.workdir / "server.log",
            echo_log=True,
            extra_args=METRICS_ARGS,
            startup_timeout_s=args.startup_timeout,
            port_wait_s=10.0,  # a restart may find the dead server's ports still held for a moment
            # the keyed admin APIs (server.admin): a Secret's key, or a random one nobody outside holds
            admin_key=os.environ.get(ADMIN_KEY_ENV) or None,
            # no front here, and every interface bound: Triton's shared-memory API needs the admin key
            # unless --trusted-shared-memory (server.cli_options)
        )
    )
    if args.print:
        print(" ".join(server.command()))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    supervisor = Supervisor(server, args.workdir / "supervisor.json", stop_server=TritonServer.terminate)
    supervisor.handle_signals()
    probes = ProbeEndpoint(supervisor, args.host, args.probe_port).start()
    try:
        supervisor.start()
    except ServerError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    try:
        return supervisor.run()
    finally:
        probes.stop()


if __name__ == "__main__":
    sys.exit(main())
