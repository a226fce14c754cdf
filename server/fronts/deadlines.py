"""Every inference a front forwards is answered within its model's deadline (``request_deadline_s``, else
``--deadline-s``), slot wait included, and what Triton still runs after it is bounded per model
(fault matrix rows 56–58; docs/SERVING.md, "Deadlines and client shares").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from server.fronts.client_slots import ClientSlots
from server.fronts.refusal import Refusal, RequestRefusedError

log = logging.getLogger(__name__)
T = TypeVar("T")
DEFAULT_DEADLINE_S = 60.0
DEFAULT_MAX_OVERDUE = 64
OVERDUE_TIMEOUT_S = 600.0  # an overdue request Triton never answers is dropped after this long
STREAM_WATCH_S = 0.25  # how often a stream's deadlines are looked at


def deadline_refusal(model: str, deadline_s: float) -> RequestRefusedError:
    return RequestRefusedError(
        f"model '{model}' did not answer within its deadline of {deadline_s:g} s; the front stopped "
        "waiting and freed this request's slot",
        Refusal.DEADLINE,
    )


class Deadlines:
    """``await within(...)`` around each inference; ``overdue`` counts what Triton still runs."""

    def __init__(self, slots: ClientSlots, max_overdue: int = DEFAULT_MAX_OVERDUE) -> None:
        self.slots, self.max_overdue = slots, max_overdue
        self.overdue: Counter[str] = Counter()
        self._finishing: set[asyncio.Future] = set()  # the overdue exchanges' waits, kept until done

    async def within(
        self, address: str, connection: str, model: str, deadline_s: float, call: Callable[[], Awaitable[T]]
    ) -> T:
        """``await call()`` within the client's share and ``deadline_s`` (then it runs on, overdue)."""
        if self.overdue[model] >= self.max_overdue:
            raise RequestRefusedError(
                f"model '{model}' already has {self.overdue[model]} requests past their deadline that "
                "tritonserver is still running; it takes no more until it answers some (retry later)",
                Refusal.TOO_MANY,
            )
        scope = asyncio.timeout(deadline_s)
        try:
            async with scope, self.slots.held(address, connection):
                exchange = asyncio.ensure_future(call())
                try:
                    return await asyncio.shield(exchange)
                except asyncio.CancelledError:
                    if scope.expired():
                        self.overdue[model] += 1
                        finish = asyncio.ensure_future(self._finish(model, exchange))
                        self._finishing.add(finish)
                        finish.add_done_callback(self._finishing.discard)
                    else:
                        exchange.cancel()
                    raise
        except TimeoutError:
            if scope.expired():
                raise deadline_refusal(model, deadline_s) from None
            raise

    async def _finish(self, model: str, exchange: asyncio.Future) -> None:
        """Let an overdue exchange end (at most ``OVERDUE_TIMEOUT_S``), counted against ``model``."""
        try:
            await asyncio.wait_for(exchange, OVERDUE_TIMEOUT_S)
        except Exception as error:  # the client already has its 504: only worth a debug line
            log.debug("an overdue request ended with %r", error)
        finally:
            self.overdue[model] -= 1
            if self.overdue[model] <= 0:
                del self.overdue[model]


@dataclass(frozen=True)
class _Waiting:
    expires: float
    model: str
    deadline_s: float
    request_id: str


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
            )

    def add(self, request: service_pb2.ModelInferRequest, deadline_s: float) -> None:
        """Count ``request`` as waiting, under the id Triton will answer it with."""
        self.check_room()
        expires = time.monotonic() + deadline_s
        self.waiting.append(_Waiting(expires, request.model_name, deadline_s, request.id))

    def answered(self, raw: bytes) -> None:
        try:
            request_id = service_pb2.ModelStreamInferResponse.FromString(raw).infer_response.id
        except DecodeError:
            request_id = ""
        match = next((w for w in self.waiting if request_id and w.request_id == request_id), None)
        if match is not None:
            self.waiting.remove(match)
        elif self.waiting:
            del self.waiting[0]

    def overdue(self) -> RequestRefusedError | None:
        """The refusal for the first message past its deadline, or None."""
        now = time.monotonic()
        late = next((w for w in self.waiting if w.expires <= now), None)
        return None if late is None else deadline_refusal(late.model, late.deadline_s)
