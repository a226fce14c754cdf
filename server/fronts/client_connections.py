"""How many connections a front holds open, one policy for both fronts (fault matrix row 73): a share
per client address, all below the descriptor limit. One beyond is refused with the protocol's clearest
answer (HTTP 503; gRPC ``RESOURCE_EXHAUSTED`` on its first call, as a ``GOAWAY`` before any call makes
tritonclient retry without end), then closed; at most ``REFUSED_WAITING`` such connections wait.
"""

from __future__ import annotations

import asyncio
import resource
from collections import Counter
from dataclasses import dataclass
from typing import cast

from server.fronts.refusal_log import note_refusal

# an HTTP/1.1 client needs at most one connection per request in flight (a gRPC client multiplexes):
# 512 is 8 times the requests an address may have waiting (64)
PER_ADDRESS = 512
TOTAL = 8192
RESERVED_FDS = 1024  # kept for the front's own: its upstream connections, body workers, logs
LINGER_S = 1.0  # a refused connection stays this long (or until the client closes) to read its answer
REFUSED_WAIT_S = 2.0  # a refused gRPC connection waits this long for the call its answer goes to
REFUSED_WAITING = 64  # refused connections waiting for their answer or their close, all clients


@dataclass(frozen=True)
class ConnectionShare:
    per_address: int = PER_ADDRESS  # connections one client address may hold open
    total: int = TOTAL  # all clients together (and at most the descriptor limit less a reserve)


DEFAULT_SHARE = ConnectionShare()


def raise_open_file_limit(wanted: int) -> int:
    """Raise the soft open-file limit to ``wanted``, up to the hard limit, never down (a default 1,024 would
    cut 8,192 connections to 512); returns the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return soft
    raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if raised > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
        except (OSError, ValueError):  # not allowed here: the shares adapt to the soft limit instead
            return soft
    return raised


def descriptor_room(total: int, kept: int = 0) -> int:
    """``total``, or fewer, so that every connection, ``RESERVED_FDS`` and ``kept`` (a full region table)
    stay within the open-file limit (the reserve takes at most half a small limit)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return total
    return max(1, min(total, soft - min(RESERVED_FDS + kept, soft // 2)))


def peer_address(peer: object) -> str:
    """A socket's ``peername`` as the address shares are counted by (an IPv4-mapped IPv6 one as IPv4)."""
    if isinstance(peer, tuple) and len(peer) >= 2:
        host = str(peer[0])
        return host[7:] if host.startswith("::ffff:") else host
    return str(peer)


class AddressCounts:
    """What the front holds open, by client address and in all, each bounded: its connections (row 73)
    and its gRPC calls (row 77)."""

    def __init__(self, per_address: int, total: int) -> None:
        self.per_address, self.total = per_address, total
        self.by_address: Counter[str] = Counter()
        self.count = 0

    def take(self, address: str) -> bool:
        """Count one more for ``address``; False (not counted) beyond its share or the total."""
        if self.count >= self.total or self.by_address[address] >= self.per_address:
            return False
        self.by_address[address] += 1
        self.count += 1
        return True

    def bound_met(self, address: str) -> str:
        """Which bound ``take`` refused ``address`` at, in words for the front's log."""
        return "its address's share" if self.by_address[address] >= self.per_address else "the front's total"

    def release(self, address: str) -> None:
        self.count -= 1
        self.by_address[address] -= 1
        if self.by_address[address] <= 0:
            del self.by_address[address]


class ClientConnections(AddressCounts):
    """``admit(address)`` as a connection is accepted, ``release(address)`` once it is gone."""

    def __init__(self, limits: ConnectionShare, kept: int = 0) -> None:
        super().__init__(limits.per_address, descriptor_room(limits.total, kept))
        self.refused_waiting: set[object] = set()  # refused connections waiting for their answer or close

    def admit(self, address: str) -> str | None:
        """Count a new connection from ``address``; or, beyond a share, why it is refused (not counted)."""
        if self.take(address):
            return None
        bound = self.bound_met(address)
        note_refusal(f"connections beyond {bound} (503 / RESOURCE_EXHAUSTED, fault matrix row 73)", address)
        if self.by_address[address] >= self.per_address:
            return (
                f"this client address ({address}) already holds {self.by_address[address]} connections to "
                f"the front, its share ({self.per_address} per address, {self.total} in all); reuse them or "
                "close some"
            )
        return (
            f"the front already holds {self.count} client connections, all it takes; retry when "
            "other clients close theirs"
        )

    def wait_refused(self, connection: object) -> bool:
        """Whether a refused connection may wait for its answer (counted until ``refused_gone``)."""
        if len(self.refused_waiting) >= REFUSED_WAITING:
            return False
        self.refused_waiting.add(connection)
        return True

    def refused_gone(self, connection: object) -> None:
        self.refused_waiting.discard(connection)


def close_after_answer(transport: asyncio.BaseTransport) -> None:
    """End a refused connection whose answer was written: no more is sent, what the client sends is
    discarded (the protocol's part), and the socket closes when the client closes or after ``LINGER_S``."""
    writer = cast(asyncio.WriteTransport, transport)
    if writer.can_write_eof():
        writer.write_eof()
    asyncio.get_running_loop().call_later(LINGER_S, writer.abort)
