"""A server's ports: free ones the OS picks, or blocks of ``PORTS_PER_SERVER`` from a fixed base
(``--port-base``) where a taken port is an error naming it; ``held_by`` reads the kernel's socket tables
to tell whose answer the readiness probe got on an OS-picked port another process took first."""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import threading
import time
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from server.fronts.peer import TABLES  # the kernel's socket tables, as the fronts read them
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
    parser.add_argument(
        "--port-base",
        type=port_base_argument,
        default=None,
        help=f"take every server's ports from this base ({PORTS_PER_SERVER} per server: HTTP, gRPC, metrics, "
        "Triton's own HTTP and gRPC behind the fronts) instead of free ports the OS picks",
    )


def check_port_free(host: str, port: int, wait_s: float, name: str) -> None:
    """``ServerError`` if something still listens on ``host:port`` after ``wait_s`` seconds: another
    Triton there would answer the readiness probe for ours."""
    deadline = time.monotonic() + wait_s
    while True:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is no obstacle
            try:
                sock.bind((host, port))
                return
            except OSError as error:
                if time.monotonic() >= deadline:
                    raise ServerError(
                        f"port {name} on {host} is in use ({error.strerror}); pick another or stop it"
                    ) from error
        time.sleep(0.25)


def free_ports(hosts: Sequence[str], taken: Collection[int] = ()) -> list[int]:
    """A free port for each of ``hosts``, all different and none of ``taken``: every socket stays bound
    until all are picked, or the OS may hand one out twice (another process may still take one first)."""
    picked: list[int] = []
    with contextlib.ExitStack() as bound:
        for host in hosts:
            port = 0
            while port == 0 or port in taken or port in picked:
                sock = bound.enter_context(socket.socket())
                sock.bind((host, 0))
                port = sock.getsockname()[1]
            picked.append(port)
    return picked


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports([host])[0]


LISTEN = "0A"  # the state column of a listening socket


def listening_inodes() -> dict[int, set[str]]:
    """The inodes of the sockets listening on each port (any address), from one read of the tables."""
    inodes: dict[int, set[str]] = {}
    for table in TABLES:
        with contextlib.suppress(OSError):
            for line in table.read_text().splitlines()[1:]:
                fields = line.split()  # sl, local address:port, remote, state, ..., inode (10th)
                if len(fields) > 9 and fields[3] == LISTEN:
                    inodes.setdefault(int(fields[1].rsplit(":", 1)[1], 16), set()).add(fields[9])
    return inodes


def socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets process ``pid`` holds ({} when it is gone)."""
    found: set[str] = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    found.add(link[len("socket:[") : -1])
    return found


def held_by(ports: Iterable[int], pids: Iterable[int]) -> bool:
    """Whether something listens on each of ``ports`` and every such socket is one of ``pids``'."""
    if not any(table.exists() for table in TABLES):
        return True
    ours, listening = set().union(*(socket_inodes(pid) for pid in pids)), listening_inodes()
    return all((found := listening.get(port)) and found <= ours for port in ports)
