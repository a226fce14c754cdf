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
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TypeVar

from server.fronts.client_slots import ClientSlots
from server.fronts.refusal import Refusal, RequestRefusedError

log = logging.getLogger(__name__)
T = TypeVar("T")
DEFAULT_DEADLINE_S = 60.0
DEFAULT_MAX_OVERDUE = 64
OVERDUE_TIMEOUT_S = 600.0  # an overdue request Triton never answers is dropped after this long


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
