"""The server flags shared by ``python -m server start`` (``make serve``) and ``python -m server.container``
(the image's entry point), and the ``ServerOptions`` they make: one definition, two defaults for host."""

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
    parser.add_argument("--model-control-mode", choices=("none", "explicit"), default="none")


def server_options(args: argparse.Namespace, **more: Any) -> ServerOptions:
    """``ServerOptions`` from the flags above, plus whatever the caller sets itself (``more``)."""
    return ServerOptions(
        repository=args.repository,
        host=args.host,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        model_control_mode=args.model_control_mode,
        **more,
    )
