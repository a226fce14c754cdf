"""``python -m server.container``: the entry point of this project's server image (deploy/Dockerfile).

Runs the supervisor in the foreground as the container's main process: tritonserver as ``TritonServer``
starts it, restarted in place when it dies, its log on stdout, and ``--probe-port`` answering the pod's
``/ready`` and ``/live`` (``server.readiness``). SIGTERM goes on to tritonserver, which finishes what is
in flight for up to ``--exit-timeout``; ``terminationGracePeriodSeconds`` must exceed the preStop pause
plus that (tests/deploy/test_manifests.py). Binds all interfaces: the Service and probes must reach it.
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
    server = TritonServer(
        server_options(
            args,
            exit_timeout_s=args.exit_timeout,
            workdir=args.workdir,
            log_path=args.workdir / "server.log",
            echo_log=True,
            extra_args=METRICS_ARGS,
            startup_timeout_s=args.startup_timeout,
            port_wait_s=10.0,  # a restart may find the dead server's ports still held for a moment
            admin_key=os.environ.get(ADMIN_KEY_ENV) or None,  # a Secret's key, or a random one
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
