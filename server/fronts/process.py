"""What the two front processes share: their flags, the admin key, the server's own regions, and their
life: a front outlives a tritonserver that dies, so clients get 503 / ``UNAVAILABLE`` during a
restart (fault matrix row 46), and exits on SIGTERM or once its owner and its server are gone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any

from server.admin import KEY_ENV
from server.config_changes import ConfigChanges
from server.fronts.client_connections import RESERVED_FDS, ConnectionShare, raise_open_file_limit
from server.fronts.client_regions import MAX_REGIONS, Client, FrontRegions, ServerRegions
from server.fronts.client_slots import (
    DEFAULT_DEADLINE_S,
    DEFAULT_MAX_OVERDUE,
    ClientSlots,
    Deadlines,
    SlotLimits,
)
from server.fronts.peer import peer_uid
from server.fronts.refusal_log import REFUSALS
from server.fronts.signature_cache import ModelSignatures
from server.proc_stat import running
from server.shm_private import make_owner_only
from server.stubs import stub_regions

MIB = 1 << 20
# The fronts' own bound on any body or message, and on what one request may copy in from shared memory
# (a batch-32 image request as JSON is about 8 MB); an inference is bounded by its model's config too.
MAX_REQUEST_BYTES = 64 * MIB


def positive(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type for a time, size or count the fronts need above 0: at 0 a front would end or
    refuse every call, which no operator asks for on purpose."""

    def parse(text: str) -> Any:
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{text!r} is not above 0")
        return value

    parse.__name__ = kind.__name__  # argparse names the type when ``kind`` itself refuses the text
    return parse


def front_parser(prog: str, description: str | None, upstream_help: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--listen", required=True, help="host:port clients connect to")
    parser.add_argument("--upstream", required=True, help=upstream_help)
    parser.add_argument("--server-pid-file", type=Path, help="holds the pid of the tritonserver to follow")
    parser.add_argument("--owner-pid", type=int, help="the process that started this front")
    parser.add_argument("--shm-prefix", default="", help="the server's Python-backend region prefix")
    parser.add_argument(
        "--config-changes",
        type=Path,
        help="the launcher's file naming the models whose served config changed (server.config_changes)",
    )
    parser.add_argument(
        "--trusted-shared-memory",
        action="store_true",
        help="forward system shared memory to Triton, which maps the client's file itself (a server "
        "whose only client is trusted; docs/SERVING.md, Shared memory)",
    )
    return parser


# The flags of ``FrontShares``: name, the field each sets, type, help.
SHARE_FLAGS = (
    ("deadline-s", "deadline_s", positive(float), "an inference is answered within this many seconds "
     "(504 / DEADLINE_EXCEEDED after), unless its model's config sets request_deadline_s"),
    ("max-overdue", "max_overdue", int, "requests past their deadline tritonserver may still "
     "run per model (429 / RESOURCE_EXHAUSTED beyond)"),
    ("upstream-slots", "slots.capacity", positive(int), "requests a front forwards at once, all clients "
     "together"),
    ("max-client-requests", "slots.per_address", positive(int), "requests one client address may have "
     "waiting (429 / RESOURCE_EXHAUSTED beyond)"),
    ("max-connection-requests", "slots.per_connection", positive(int), "requests one client connection "
     "may have waiting (429 / RESOURCE_EXHAUSTED beyond)"),
    ("max-client-connections", "connections.per_address", positive(int), "connections one client "
     "address may hold open (503 / GOAWAY as it connects beyond)"),
    ("max-connections", "connections.total", positive(int), "connections all clients together may hold "
     "open (fewer where the open-file limit would not hold them)"),
)  # fmt: skip


@dataclass(frozen=True)
class FrontShares:
    """An inference's deadline and each client's share of Triton, the same on both fronts."""

    deadline_s: float = DEFAULT_DEADLINE_S  # unless the model's config sets request_deadline_s
    max_overdue: int = DEFAULT_MAX_OVERDUE  # per model: requests past their deadline Triton still runs
    slots: SlotLimits = field(default_factory=SlotLimits)
    connections: ConnectionShare = field(default_factory=ConnectionShare)  # held open (row 73)

    def flags(self) -> list[str]:
        """The fronts' command-line flags for these shares."""
        return [f"--{name}={attrgetter(path)(self)}" for name, path, _, _ in SHARE_FLAGS]


def add_share_arguments(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """The flags of ``FrontShares``, ``--front-`` prefixed on ``python -m server start``."""
    for name, path, kind, text in SHARE_FLAGS:
        parser.add_argument(
            f"--{prefix}{name}", type=kind, default=attrgetter(path)(FrontShares()), help=text
        )


def shares_from_args(args: argparse.Namespace, prefix: str = "") -> FrontShares:
    """The ``FrontShares`` of the flags ``add_share_arguments`` added with ``prefix``."""
    deadline_s, max_overdue, capacity, per_address, per_connection, connections, total = (
        getattr(args, (prefix + name).replace("-", "_")) for name, _, _, _ in SHARE_FLAGS
    )
    slots = SlotLimits(capacity, per_address, per_connection)
    return FrontShares(deadline_s, max_overdue, slots, ConnectionShare(connections, total))


class UpstreamState:
    """Whether Triton answers, logged once per change rather than per failed request."""

    def __init__(self, what: str, logger: logging.Logger, answer: str = "502/503") -> None:
        self.what, self.log, self.answer = what, logger, answer
        self.reachable: bool | None = None  # None: not tried yet

    def down(self, error: BaseException) -> None:
        if self.reachable is not False:
            self.log.warning(
                "%s is not answering (%s); clients get %s until it does", self.what, error, self.answer
            )
        self.reachable = False

    def up(self) -> None:
        if self.reachable is False:
            self.log.info("%s answers again", self.what)
        self.reachable = True


def current_server_pid(pid_file: Path | None) -> int | None:
    """The pid of the tritonserver the launcher started last (None: no file, or not readable yet)."""
    if pid_file is None:
        return None
    try:
        return int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


class Front:
    """What both fronts hold; ``_model_config`` fetches a config in the front's own protocol."""

    regions: type[FrontRegions]  # the clients' shared memory in the front's protocol

    def __init__(self, args: argparse.Namespace, max_request_bytes: int, state: UpstreamState) -> None:
        self.args, self.upstream, self.shares, self.state = args, args.upstream, shares_from_args(args), state
        self.key = os.environ.get(KEY_ENV, "")  # not a flag: a command line is world-readable in /proc
        # the server's own regions (its prefix, every live stub's) no client may register
        self.shm = self.regions(
            ServerRegions(args.shm_prefix, stub_regions), max_request_bytes, args.trusted_shared_memory
        )
        # the models whose served config changed, as the launcher's file names them (fault matrix row 79)
        changes = ConfigChanges(args.config_changes) if args.config_changes is not None else None
        self.signatures = ModelSignatures(self._model_config, max_request_bytes, changes)
        self.slots = ClientSlots(self.shares.slots)
        self.deadlines = Deadlines(self.slots, self.shares.max_overdue)

    async def _model_config(self, model: str, version: str) -> Mapping[str, Any]:
        raise NotImplementedError

    def client(self, transport: Any, sent_key: str | None) -> Client:
        """Who sent a request: its socket's owner on this host, and whether it carries the admin key."""
        peer, local = transport.get_extra_info("peername"), transport.get_extra_info("sockname")
        uid = peer_uid(peer[:2], local[:2]) if peer and local else None
        return Client(uid, bool(self.key) and sent_key == self.key)


def _still_needed(args: argparse.Namespace) -> bool:
    """Its owner or its server still runs (without either flag: until SIGTERM)."""
    if args.owner_pid is None and args.server_pid_file is None:
        return True
    return running(args.owner_pid) or running(current_server_pid(args.server_pid_file))


async def _until_stopped(args: argparse.Namespace) -> None:
    """Until SIGTERM or nobody needs the server, keeping its regions owner-only and the refusal log due."""
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    own_regions = ServerRegions(args.shm_prefix)  # this server's prefix alone: no /proc scan a second
    while not stop.is_set() and _still_needed(args):
        make_owner_only(args.shm_prefix)
        own_regions.remember()
        REFUSALS.flush()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


def run_front(
    parser: argparse.ArgumentParser,
    argv: list[str] | None,
    start: Callable[[argparse.Namespace], Awaitable[Callable[[], Awaitable[None]]]],
) -> None:
    """Run a front: ``start(args)`` listens and returns its ``stop()``, awaited once ``_until_stopped``."""
    add_share_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # every connection of the shares (row 73), the front's own and a full region table, where the hard
    # limit allows: before the shares read the soft limit
    raise_open_file_limit(shares_from_args(args).connections.total + RESERVED_FDS + MAX_REGIONS)

    async def main() -> None:
        stop = await start(args)
        try:
            await _until_stopped(args)
        finally:
            await stop()
            REFUSALS.flush(everything=True)  # the refusals counted since their last line

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
