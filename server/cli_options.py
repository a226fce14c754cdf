"""The server flags of ``python -m server start`` and ``python -m server.container``, and the
``ServerOptions`` they make."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from server.fronts.process import positive
from server.launcher import ServerOptions

# The fronts' times ``python -m server start`` sets (flag, ``ServerOptions`` field, help); each front
# alone takes the same flag without ``front-``.
FRONT_TIMEOUTS = (
    ("front-body-timeout-s", "http_front_body_timeout_s", "an HTTP request body must be whole this many "
     "seconds after it begins (408 after; fault matrix row 6)"),
    ("front-header-timeout-s", "http_front_header_timeout_s", "HTTP request headers must be whole this "
     "many seconds after their first byte (408 after; row 13)"),
    ("front-message-timeout-s", "grpc_front_message_timeout_s", "a gRPC message must be whole this many "
     "seconds after a unary call starts or a stream's message begins (DEADLINE_EXCEEDED after; rows 71, 75)"),
    ("front-idle-timeout-s", "grpc_front_idle_timeout_s", "a gRPC connection without calls is closed, and "
     "a stream that sent no message ended, after this many seconds (row 77)"),
)  # fmt: skip


def add_server_arguments(
    parser: argparse.ArgumentParser, repository: Path, host: str, host_help: str, startup_timeout: float
) -> None:
    parser.add_argument("--repository", type=Path, default=repository)
    parser.add_argument(
        "--startup-timeout",
        type=float,
        default=startup_timeout,
        help="seconds a (re)start may take to be ready",
    )
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
    return ServerOptions(
        repository=args.repository,
        host=args.host,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        trusted_shared_memory=args.trusted_shared_memory,
        startup_timeout_s=args.startup_timeout,
        **more,
    )


def add_front_timeout_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = {option.name: option.default for option in dataclasses.fields(ServerOptions)}
    for flag, name, text in FRONT_TIMEOUTS:
        parser.add_argument(f"--{flag}", type=positive(float), default=defaults[name], help=text)


def front_timeouts(args: argparse.Namespace) -> dict[str, float]:
    return {name: getattr(args, flag.replace("-", "_")) for flag, name, _ in FRONT_TIMEOUTS}
