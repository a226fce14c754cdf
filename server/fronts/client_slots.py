"""How many requests each client connection and address may have waiting on Triton, and who gets a
free slot (the waiting address holding the fewest): one policy for both fronts (fault matrix rows 38
and 57; docs/SERVING.md, "Deadlines and client shares").
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass

from server.fronts.refusal import Refusal, RequestRefusedError


@dataclass(frozen=True)
class SlotLimits:
    capacity: int = 256  # requests forwarded at once, all clients together
    per_address: int = 64  # requests one client address may have waiting (held or queued)
    per_connection: int = 32  # requests one client connection may have waiting


class ClientSlots:
    """``async with slots.held(address, connection):`` around each forwarded request."""

    def __init__(self, limits: SlotLimits) -> None:
        self.limits = limits
        self.taken = 0  # slots held, all addresses
        self.holding: Counter[str] = Counter()  # slots held, by address
        self.by_address: Counter[str] = Counter()  # held or queued, by address
        self.by_connection: Counter[str] = Counter()  # held or queued, by connection
        self.queues: dict[str, deque[asyncio.Future]] = {}

    def _refusal(self, address: str, connection: str) -> RequestRefusedError | None:
        limits = self.limits
        if self.by_connection[connection] >= limits.per_connection:
            count, share, who = self.by_connection[connection], limits.per_connection, "connection"
        elif self.by_address[address] >= limits.per_address:
            count, share, who = self.by_address[address], limits.per_address, "address"
        else:
            return None
        return RequestRefusedError(
            f"this client {who} ({connection if who == 'connection' else address}) already has {count} "
            f"requests waiting on tritonserver, its share ({share} per {who}, {limits.capacity} in all); "
            "send more when those are answered",
            Refusal.TOO_MANY,
        )

    @contextlib.asynccontextmanager
    async def held(self, address: str, connection: str, wait_s: float | None = None) -> AsyncIterator[None]:
        """Hold a slot for the block (``TOO_MANY`` over the client's share, or after ``wait_s``)."""
        refusal = self._refusal(address, connection)
        if refusal is not None:
            raise refusal
        self.by_address[address] += 1
        self.by_connection[connection] += 1
        try:
            try:
                async with asyncio.timeout(wait_s):
                    await self._take(address)
            except TimeoutError:
                raise RequestRefusedError(
                    f"no slot of the {self.limits.capacity} to tritonserver freed within {wait_s:g} s; retry",
                    Refusal.TOO_MANY,
                ) from None
            try:
                yield
            finally:
                self._give_back(address)
        finally:
            _drop(self.by_address, address)
            _drop(self.by_connection, connection)

    async def _take(self, address: str) -> None:
        if self.taken < self.limits.capacity and not self.queues:
            self.taken += 1
            self.holding[address] += 1
            return
        granted = asyncio.get_running_loop().create_future()
        self.queues.setdefault(address, deque()).append(granted)
        try:
            await granted  # _give_back hands the slot over: taken already counts it
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self._give_back(address)  # handed over just as the wait was cancelled
            else:
                self._leave_queue(address, granted)
            raise

    def _leave_queue(self, address: str, granted: asyncio.Future) -> None:
        queue = self.queues.get(address)
        if queue is not None and granted in queue:
            queue.remove(granted)
            if not queue:
                del self.queues[address]

    def _give_back(self, address: str) -> None:
        """Free ``address``'s slot: to the waiting address holding the fewest, else back to the pool."""
        _drop(self.holding, address)
        while self.queues:
            fewest = min(self.queues, key=lambda waiting: self.holding[waiting])
            queue = self.queues[fewest]
            granted = queue.popleft()
            if not queue:
                del self.queues[fewest]
            if not granted.done():  # a wait cancelled a moment ago is skipped
                self.holding[fewest] += 1
                granted.set_result(None)
                return
        self.taken -= 1


def _drop(counter: Counter[str], key: str) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]
