"""The server flags of ``python -m server start`` and ``python -m server.container``, and the
``ServerOptions`` they make."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from server.launcher import ServerOptions


def add_server_arguments(
    parser: argparse.ArgumentParser, repository: Path, host: str, host_help: str
) -> None:
    parser.add_argument("--repository", type=Path, default=repository)
    parser.add_argument("--host", default=host, help=host_help)
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--metrics-port", type=int, default=8002)
    parser.add_argument(
        "--trusted-shared-memory",
        action="store_true",
        help="let tritonserver map the /dev/shm files clients register, as Triton does by default, "
        "instead of the fronts copying the bytes; only for a server whose only client is trusted: "
        "Triton 2.51 applies a registration's offset twice (reading and writing beyond the region, "
        "into other clients' memory or a crash), maps whatever file the name reaches when it "
        "registers, and dies of SIGBUS if a file is cut short under a copy (docs/SERVING.md, Shared memory)",
    )


def server_options(args: argparse.Namespace, **more: Any) -> ServerOptions:
    """``ServerOptions`` from the flags above, plus what the caller sets itself (``more``)."""
    return ServerOptions(
        repository=args.repository,
        host=args.host,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        trusted_shared_memory=args.trusted_shared_memory,
        **more,
    )
