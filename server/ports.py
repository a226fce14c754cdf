"""Server ports from one fixed base (``PORT_BASE=`` / ``--port-base``) instead of the OS's choice.

With a base, every server a process starts (perf, soak) takes ``PORTS_PER_SERVER`` consecutive ports
from it, in ``ROLES`` order; one started while another still runs takes the next block. A port already
taken is an error that names it, never a silent move, so a firewall can plan for them.
"""

from __future__ import annotations

import argparse
import threading
from dataclasses import dataclass

from server.install import ServerError

PORTS_PER_SERVER = 5  # http, grpc, metrics, triton_http, triton_grpc
MAX_SERVERS = 10  # servers of one process running at once: the base's block is MAX_SERVERS × 5 ports
LOWEST, HIGHEST = 1024, 65535 - PORTS_PER_SERVER * MAX_SERVERS + 1
ROLES = (
    "HTTP",
    "gRPC",
    "metrics",
    "Triton's own HTTP behind the front",
    "Triton's own gRPC behind the front",
)

_lock = threading.Lock()
_base: int | None = None
_held: set[int] = set()  # slots of servers of this process that are running (or about to)


@dataclass(frozen=True)
class ServerPorts:
    """One server's ports from the base: ``slot`` is which block of ``PORTS_PER_SERVER``."""

    base: int
    slot: int

    def all(self) -> tuple[int, ...]:
        """The block's ports in ``ROLES`` order."""
        first = self.base + self.slot * PORTS_PER_SERVER
        return tuple(range(first, first + PORTS_PER_SERVER))

    def describe(self, port: int) -> str:
        """``port`` as the user set it, e.g. ``9001 (PORT_BASE 9000 + 1, gRPC)``."""
        offset = port - self.base
        role = ROLES[offset % PORTS_PER_SERVER] if 0 <= offset < PORTS_PER_SERVER * MAX_SERVERS else "?"
        return f"{port} (PORT_BASE {self.base} + {offset}, {role})"


def use_port_base(base: int | None) -> None:
    """From now on every server this process starts takes its ports from ``base`` (None: the OS's)."""
    global _base
    _base = base


def port_base() -> int | None:
    return _base


def reserve() -> ServerPorts | None:
    """The lowest block no running server of this process holds, now held (None without a base)."""
    if _base is None:
        return None
    with _lock:
        free = [slot for slot in range(MAX_SERVERS) if slot not in _held]
        if not free:
            raise ServerError(
                f"more than {MAX_SERVERS} servers at once on PORT_BASE {_base} "
                f"(ports {_base}–{_base + PORTS_PER_SERVER * MAX_SERVERS - 1})"
            )
        _held.add(free[0])
        return ServerPorts(_base, free[0])


def hold(ports: ServerPorts | None) -> None:
    """``ports`` held again (a server started once more, e.g. by the supervisor)."""
    if ports is not None:
        with _lock:
            _held.add(ports.slot)


def release(ports: ServerPorts | None) -> None:
    """``ports`` free for the next server of this process (its server has stopped)."""
    if ports is not None:
        with _lock:
            _held.discard(ports.slot)


def port_base_argument(text: str) -> int:
    """``--port-base`` as argparse reads it: a usage error names the range."""
    try:
        base = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not LOWEST <= base <= HIGHEST:
        raise argparse.ArgumentTypeError(
            f"{base} is outside {LOWEST}–{HIGHEST} (each server takes {PORTS_PER_SERVER} ports from the "
            f"base, up to {MAX_SERVERS} servers at once)"
        )
    return base


def add_port_base_option(parser: argparse.ArgumentParser) -> None:
    """``--port-base`` on a command that starts servers of its own."""
    parser.add_argument(
        "--port-base",
        type=port_base_argument,
        default=None,
        help=f"take every server's ports from this base ({PORTS_PER_SERVER} per server: HTTP, gRPC, metrics, "
        "Triton's own HTTP and gRPC behind the fronts) instead of free ports the OS picks",
    )
