"""Every inference request a front forwards is answered within its model's deadline, and what Triton
still runs after that is bounded (fault matrix rows 56–58).

Triton 2.51 answers some requests late and some never (``[0, 0]`` to the text encoder held an HTTP
front connection for its 600 s timeout), and a model can simply be slower than its clients can wait.
So each forwarded inference has a deadline: the model config's ``request_deadline_s`` parameter, or
the front's default (``--deadline-s``, 60 s). It covers the wait for a slot (``client_slots``) and
Triton's answer. When it passes, the client gets 504 / ``DEADLINE_EXCEEDED`` naming the model and
the deadline, and its slot goes to the next request at once.

Triton's HTTP frontend does not stop a request whose connection closes (measured: all of them ran), so
a request past its deadline is not cut off: it runs on in the background until Triton answers it
(``OVERDUE_TIMEOUT_S`` at most), and counts as overdue for its model. A model with
``max_overdue`` such requests gets 429 / ``RESOURCE_EXHAUSTED`` for new ones until Triton answers some: a
slow model cannot pile up requests inside Triton, and other models are not affected.

A gRPC stream is one call of many messages: ``StreamWaits`` keeps its messages still waiting for their
answer, each with its model's deadline, bounds how many wait, and ends a stream whose message is not
answered in time, as a unary call gets ``DEADLINE_EXCEEDED``.
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
    """``await deadlines.within(...)`` around each forwarded inference; ``overdue`` counts, by model,
    the requests whose client got its 504 and Triton still runs."""

    def __init__(self, slots: ClientSlots, max_overdue: int = DEFAULT_MAX_OVERDUE) -> None:
        self.slots, self.max_overdue = slots, max_overdue
        self.overdue: Counter[str] = Counter()
        self._finishing: set[asyncio.Future] = set()  # the overdue exchanges' waits, kept until done

    async def within(
        self, address: str, connection: str, model: str, deadline_s: float, call: Callable[[], Awaitable[T]]
    ) -> T:
        """``await call()`` (one upstream exchange) holding a slot of ``slots`` for the client, or
        ``RequestRefusedError``: over the client's share (``TOO_MANY``), ``model`` with ``max_overdue``
        overdue requests (``TOO_MANY``), or no answer within ``deadline_s`` (``DEADLINE``; the exchange
        runs on, counted as overdue until it ends). A client that goes away (the caller is cancelled)
        cancels the exchange."""
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
        """Let an overdue exchange end (Triton's answer, or ``OVERDUE_TIMEOUT_S``; nobody reads it),
        counted against ``model`` until then."""
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
    """``add`` each forwarded message, ``answered`` each answer; ``overdue()`` says when one is late.

    Triton answers a stream's messages in the order they finish, each carrying the request's ``id``: an
    answer takes the first waiting message of its id, or (no id, or none waiting with it) the oldest.
    The models served here answer each request once; a decoupled model's extra answers would only free
    waiting places early."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.waiting: list[_Waiting] = []

    def check_room(self) -> None:
        """``RequestRefusedError`` (``TOO_MANY``) when ``limit`` messages wait already: asked before a
        message is rewritten for Triton (its shared-memory inputs read), then ``add``ed."""
        if len(self.waiting) >= self.limit:
            raise RequestRefusedError(
                f"this stream already has {len(self.waiting)} requests waiting for their answer, its "
                "share; send more when those are answered",
                Refusal.TOO_MANY,
            )

    def add(self, request: service_pb2.ModelInferRequest, deadline_s: float) -> None:
        """Count ``request`` as waiting, under the id Triton will answer it with, or
        ``RequestRefusedError`` (``TOO_MANY``) when ``limit`` wait."""
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
