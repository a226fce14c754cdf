"""What the two front processes (``server.http_guard``, ``server.grpc_guard``) share as programs: their
common flags, the admin key from the environment, the shared-memory rules, and living exactly as long
as their tritonserver."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

from server.admin import KEY_ENV
from server.shm_ownership import RegionRules
from server.shm_regions import make_owner_only
from server.stubs import stub_regions

MIB = 1 << 20


def front_parser(prog: str, description: str | None, upstream_help: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--listen", required=True, help="host:port clients connect to")
    parser.add_argument("--upstream", required=True, help=upstream_help)
    parser.add_argument("--server-pid", type=int, help="exit when this process exits")
    parser.add_argument("--shm-prefix", default="", help="the server's Python-backend region prefix")
    return parser


def admin_key() -> str:
    """The admin key, from the environment (a command line is world-readable in ``/proc``)."""
    return os.environ.get(KEY_ENV, "")


def region_rules(args: argparse.Namespace) -> RegionRules:
    return RegionRules(args.shm_prefix, stub_regions, args.server_pid)


def _running(pid: int) -> bool:
    """Is ``pid`` running? A zombie (exited, not yet reaped by its parent) is not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].split()[0] not in ("Z", "X")


async def _until_stopped(pid: int | None, shm_prefix: str) -> None:
    """Return on SIGTERM, or once process ``pid`` is gone (a front lives as long as its server);
    meanwhile keep the server's shared-memory regions owner-only (``server.shm_regions``)."""
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    while not stop.is_set():
        make_owner_only(shm_prefix)
        if pid is None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
            continue
        if not _running(pid):
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


def run_front(
    start: Callable[[], Awaitable[Callable[[], Awaitable[None]]]], args: argparse.Namespace
) -> None:
    """Run a front: ``start()`` listens and returns its ``stop()``; it runs until SIGTERM or until
    ``args.server_pid`` exits, then stops."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    async def main() -> None:
        stop = await start()
        try:
            await _until_stopped(args.server_pid, args.shm_prefix)
        finally:
            await stop()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
