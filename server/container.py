"""``python -m server.container``: the entry point of this project's server image (deploy/Dockerfile).

It assembles the same command and environment as ``TritonServer`` (backend folder, shared-memory
sizing, ``PYTHONPATH`` and ``LD_LIBRARY_PATH`` for the wheel's server), then *replaces itself* with
tritonserver (``exec``). tritonserver is then the process Kubernetes signals: on SIGTERM it finishes the
requests in flight for up to ``--exit-timeout`` seconds and exits, with no Python wrapper in between to
forward signals or to outlive it. The pod's ``terminationGracePeriodSeconds`` must exceed the preStop
pause plus this timeout (checked by tests/unit/test_deploy_manifests.py).

Unlike ``make serve`` it binds all interfaces by default: inside a pod the Service and the kubelet's
probes must reach it. Network policy, not the bind address, limits who can.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from server.cli_options import add_server_arguments, server_options
from server.launcher import TritonServer

ADMIN_KEY_ENV = "TRITON_ADMIN_KEY"
# Latency quantiles (p50/p90/p95/p99 per model) for the dashboard and the queue-time alert.
METRICS_ARGS = ["--metrics-config=summary_latencies=true"]


def container_command(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The tritonserver command line and environment for the pod's server container."""
    options = server_options(
        args,
        exit_timeout_s=args.exit_timeout,
        workdir=args.workdir,
        extra_args=METRICS_ARGS,
        # the keyed admin APIs (server.admin): a Secret's key, or a random one nobody outside holds
        admin_key=os.environ.get(ADMIN_KEY_ENV) or None,
    )
    server = TritonServer(options)
    return server.command(), server.environment()


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
    parser.add_argument("--print", action="store_true", help="print the command instead of running it")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not args.repository.is_dir():
        print(f"error: model repository {args.repository} does not exist", file=sys.stderr)
        return 1
    command, environment = container_command(args)
    if args.print:
        print(" ".join(command))
        return 0
    sys.stdout.flush()
    os.execve(command[0], command, environment)
    return 1  # not reached: execve replaces this process


if __name__ == "__main__":
    sys.exit(main())
