"""The HTTP front's request bodies: large ones are checked in worker processes, a bounded number at a
time, so one body (60 MiB of JSON took 27 s) never stalls the other clients (fault matrix row 59);
``Content-Encoding`` bodies are inflated, bounded, and forwarded plain: Triton inflates gzip itself, so
the checked body must be the one it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import logging
import multiprocessing
import signal
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from server.fronts.refusal import Refusal, RequestRefusedError

log = logging.getLogger(__name__)
T = TypeVar("T")
INLINE_BYTES = 256 << 10  # about 30k JSON numbers: some 50 ms on the loop
DEFAULT_WORKERS = 1
DEFAULT_MAX_LARGE = 4
WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}  # deflate is the zlib format (RFC 9110)
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies


def _die_with_the_front() -> None:
    """A worker dies with its front, even one killed by SIGKILL."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class BodyCheckers:
    """``with place() as need:`` around reading a body, then ``await check(size, function, *args)``."""

    def __init__(
        self,
        workers: int = DEFAULT_WORKERS,
        max_large: int = DEFAULT_MAX_LARGE,
        inline_bytes: int = INLINE_BYTES,
    ) -> None:
        self.workers, self.max_large, self.inline_bytes = workers, max_large, inline_bytes
        self.taken = 0
        self._pool: ProcessPoolExecutor | None = None

    def start(self) -> None:
        """Start the workers now (a spawned interpreter takes a second), not on the first large body."""
        self._pool = ProcessPoolExecutor(
            self.workers, mp_context=multiprocessing.get_context("spawn"), initializer=_die_with_the_front
        )
        self._pool.submit(int)  # any task: the pool spawns its worker now

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def is_large(self, size: int | None) -> bool:
        return size is not None and size > self.inline_bytes

    @contextlib.contextmanager
    def place(self) -> Iterator[Callable[[int | None], None]]:
        """``need(size)`` once the body's size is known: a large one takes a place, given back on exit."""
        held = False

        def need(size: int | None) -> None:
            nonlocal held
            if held or not self.is_large(size):
                return
            if self.taken >= self.max_large:
                raise RequestRefusedError(
                    f"the front is already reading or checking {self.taken} large request bodies (over "
                    f"{self.inline_bytes} bytes each); retry, or send the tensor data as binary "
                    "(tritonclient's binary_data=True: a JSON header and raw bytes), which needs no parsing",
                    Refusal.TOO_MANY,
                    "large bodies beyond those the front reads at once (429, fault matrix row 59)",
                )
            self.taken += 1
            held = True

        try:
            yield need
        finally:
            if held:
                self.taken -= 1

    async def check(self, size: int, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` for a body of ``size`` bytes, in a worker when it is large."""
        if not self.is_large(size) or self._pool is None:
            return function(*args)
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, functools.partial(function, *args))
        except BrokenProcessPool as error:  # a worker died (out of memory?): start new ones
            log.warning("a body-check worker died (%s); starting new ones", error)
            self.close()
            self.start()
            raise RequestRefusedError(
                "the front's body-check worker died while checking this request; retry", Refusal.UNAVAILABLE
            ) from error


def inflate(body: bytes, encoding: str | None, limit: int) -> bytes:
    """``body`` decoded from ``encoding``: 415 for an unknown one, 400 if it does not inflate, 413."""
    name = (encoding or "identity").strip().lower()
    if name == "identity":
        return body
    if name not in WBITS:
        raise RequestRefusedError(
            f"Content-Encoding {encoding[:40]!r} is not supported; send gzip, deflate or no encoding",
            Refusal.UNSUPPORTED,
        )
    decoder = zlib.decompressobj(WBITS[name])
    try:
        plain = decoder.decompress(body, limit + 1)
    except zlib.error as error:
        raise RequestRefusedError(f"request body is not valid {name} data: {error}") from error
    if len(plain) > limit or decoder.unconsumed_tail:
        raise RequestRefusedError(f"request body inflates to more than {limit} bytes", Refusal.TOO_LARGE)
    if not decoder.eof or decoder.unused_data:
        raise RequestRefusedError(f"request body is not one complete {name} stream")
    return plain
