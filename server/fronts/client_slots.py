"""Who waits on Triton and for how long, one policy for both fronts (docs/SERVING.md, "Deadlines and
client shares"): each client connection and address has a share of the slots to Triton, a freed slot
goes to the waiting address holding the fewest (fault matrix rows 38 and 57), and every inference is
answered within its model's deadline, with what Triton still runs after it bounded per model (rows
56–58).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from server.fronts.refusal import Refusal, RequestRefusedError

log = logging.getLogger(__name__)
T = TypeVar("T")
DEFAULT_DEADLINE_S = 60.0
DEFAULT_MAX_OVERDUE = 64
OVERDUE_TIMEOUT_S = 600.0  # an overdue request Triton never answers is dropped after this long
MESSAGE_TIMEOUT_S = 30.0  # a gRPC message begun must be whole within this (fault matrix rows 71, 75)
# a gRPC connection with no call for 5 minutes is closed (GOAWAY: clients reconnect), and a stream that
# sent no message within it ended (row 77)
IDLE_TIMEOUT_S = 300.0
STREAM_WATCH_S = 0.25  # how often a stream's deadlines are looked at


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

    @contextlib.asynccontextmanager
    async def held(self, address: str, connection: str, wait_s: float | None = None) -> AsyncIterator[None]:
        """Hold a slot for the block (``TOO_MANY`` over the client's share, or after ``wait_s``)."""
        for who, client, count, share in (
            ("connection", connection, self.by_connection[connection], self.limits.per_connection),
            ("address", address, self.by_address[address], self.limits.per_address),
        ):
            if count >= share:
                raise RequestRefusedError(
                    f"this client {who} ({client}) already has {count} requests waiting on tritonserver, its "
                    f"share ({share} per {who}, {self.limits.capacity} in all); send more when those are "
                    "answered",
                    Refusal.TOO_MANY,
                    f"requests beyond its {who}'s share waiting on tritonserver (429 / RESOURCE_EXHAUSTED, "
                    "fault matrix row 38)",
                )
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
                    "no slot to tritonserver freed within the deadline (RESOURCE_EXHAUSTED)",
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
            elif granted in (queue := self.queues.get(address, ())):
                queue.remove(granted)
                if not queue:
                    del self.queues[address]
            raise

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


def deadline_refusal(model: str, deadline_s: float) -> RequestRefusedError:
    return RequestRefusedError(
        f"model '{model}' did not answer within its deadline of {deadline_s:g} s; the front stopped "
        "waiting and freed this request's slot",
        Refusal.DEADLINE,
        "an inference past its model's deadline (504 / DEADLINE_EXCEEDED, fault matrix row 56)",
    )


class QueueOrder:
    """The order requests join each model's queue in Triton, which takes them first in, first out: a
    request cancelled there, whose answer never comes, is behind Triton (dropped, or in a batch it ran)
    once Triton has run one that joined after it. Until then its slot stays held (fault matrix row 78)."""

    def __init__(self) -> None:
        self.joins: Counter[str] = Counter()
        self.cancelled: dict[asyncio.Future, tuple[str, int]] = {}  # (model, place) each waits to pass

    def joined(self, model: str) -> int:
        """A request forwarded to ``model``: its place in the model's order."""
        self.joins[model] += 1
        return self.joins[model]

    def ran(self, model: str, place: int) -> None:
        """Triton ran ``model``'s request at ``place``: those cancelled before it are passed (an error
        answer may come before the queue, so it passes none)."""
        for passed, (waiting, waiting_place) in list(self.cancelled.items()):
            if waiting == model and waiting_place < place:
                del self.cancelled[passed]
                passed.set_result(None)

    async def passed(self, model: str, place: int) -> None:
        """Wait until Triton has passed ``model``'s cancelled request at ``place``."""
        passed = asyncio.get_running_loop().create_future()
        self.cancelled[passed] = (model, place)
        try:
            await passed
        finally:
            self.cancelled.pop(passed, None)


class Deadlines:
    """``await within(...)`` around each inference; ``overdue`` counts what Triton still runs."""

    def __init__(self, slots: ClientSlots, max_overdue: int = DEFAULT_MAX_OVERDUE) -> None:
        self.slots, self.max_overdue = slots, max_overdue
        self.overdue: Counter[str] = Counter()
        # what the front still waits on for no one, kept until done: overdue exchanges, and requests
        # whose client left once they were forwarded
        self._finishing: set[asyncio.Future] = set()
        self.queues = QueueOrder()

    async def within(
        self,
        address: str,
        connection: str,
        model: str,
        deadline_s: float,
        call: Callable[[], Awaitable[T]],
        cancel_passes_on: bool = False,
    ) -> T:
        """``await call()`` within the client's share and ``deadline_s`` (then it runs on, overdue). Once it
        began, a cancelled caller leaves it the slot, as Triton runs it anyway (rows 38, 78); with
        ``cancel_passes_on`` (Triton's gRPC drops a cancelled request it has not begun) ``call()`` is
        cancelled and the slot kept until Triton has passed the request (``QueueOrder``, row 78)."""
        if self.overdue[model] >= self.max_overdue:
            raise RequestRefusedError(
                f"model '{model}' already has {self.overdue[model]} requests past their deadline that "
                "tritonserver is still running; it takes no more until it answers some (retry later)",
                Refusal.TOO_MANY,
                "a model at its bound of overdue requests (429 / RESOURCE_EXHAUSTED, fault matrix row 58)",
            )
        exchange: asyncio.Future | None = None  # ``call()``, once it began

        async def run() -> T:
            nonlocal exchange
            scope = asyncio.timeout(deadline_s)
            try:
                async with scope, self.slots.held(address, connection):
                    place = self.queues.joined(model)
                    exchange = asyncio.ensure_future(call())
                    try:
                        return await asyncio.shield(exchange)
                    except asyncio.CancelledError:
                        if scope.expired():
                            self.overdue[model] += 1
                            finish = asyncio.ensure_future(self._finish(model, exchange))
                            self._finishing.add(finish)
                            finish.add_done_callback(self._finishing.discard)
                        elif exchange.cancelled():  # its client's cancel, passed on: Triton answers no more
                            await self.queues.passed(model, place)
                        else:
                            exchange.cancel()
                        raise
                    finally:
                        if exchange.done() and not exchange.cancelled() and exchange.exception() is None:
                            self.queues.ran(model, place)
            except TimeoutError:
                if scope.expired():
                    raise deadline_refusal(model, deadline_s) from None
                raise

        running = asyncio.ensure_future(run())
        try:
            return await asyncio.shield(running)
        except asyncio.CancelledError:
            if exchange is None:
                running.cancel()  # still waiting for a slot: nothing reached Triton
            elif cancel_passes_on:
                exchange.cancel()
            self._finishing.add(running)
            running.add_done_callback(self._left_behind)
            raise

    def _left_behind(self, run: asyncio.Future) -> None:
        """A request whose client left has ended (or left the queue): its answer goes to no one."""
        self._finishing.discard(run)
        if not run.cancelled() and run.exception() is not None:
            log.debug("a request whose client left ended with %r", run.exception())

    async def _finish(self, model: str, exchange: asyncio.Future) -> None:
        """Let an overdue exchange end (at most ``OVERDUE_TIMEOUT_S``), counted against ``model``."""
        try:
            await asyncio.wait_for(exchange, OVERDUE_TIMEOUT_S)
        except Exception as error:  # the client already has its 504: only worth a debug line
            log.debug("an overdue request ended with %r", error)
        finally:
            _drop(self.overdue, model)


class _Waiting(NamedTuple):
    expires: float
    request_id: str
    model: str
    deadline_s: float


class StreamWaits:
    """A stream's messages waiting for their answer (by ``id``, else the oldest)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.waiting: list[_Waiting] = []

    def check_room(self) -> None:
        """``TOO_MANY`` when ``limit`` messages wait already (asked before regions are read)."""
        if len(self.waiting) >= self.limit:
            raise RequestRefusedError(
                f"this stream already has {len(self.waiting)} requests waiting for their answer, its "
                "share; send more when those are answered",
                Refusal.TOO_MANY,
                "stream messages beyond its share waiting for their answer (the stream's error message)",
            )

    def add(self, request: service_pb2.ModelInferRequest, deadline_s: float) -> None:
        """Count ``request`` as waiting, under the id Triton will answer it with."""
        self.check_room()
        self.waiting.append(
            _Waiting(time.monotonic() + deadline_s, request.id, request.model_name, deadline_s)
        )

    def answered(self, raw: bytes) -> None:
        try:
            request_id = service_pb2.ModelStreamInferResponse.FromString(raw).infer_response.id
        except DecodeError:
            request_id = ""
        ids = [waiting.request_id for waiting in self.waiting]
        if self.waiting:
            del self.waiting[ids.index(request_id) if request_id and request_id in ids else 0]

    def overdue(self) -> RequestRefusedError | None:
        """The refusal for the first message past its deadline, or None."""
        now = time.monotonic()
        for expires, _, model, deadline_s in self.waiting:
            if expires <= now:
                return deadline_refusal(model, deadline_s)
        return None
