"""The fronts' refusals by policy in their log, so an operator sees which bound refused which client
address how often (docs/SERVING.md, "Refusals in the front's log"): one WARNING line per (bound,
address) at most every ``WINDOW_S``, so a flood writes a few lines. A request at fault is not logged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from server.fronts.refusal import RequestRefusedError

log = logging.getLogger(__name__)
WINDOW_S = 10.0
# (bound, address) pairs kept between lines; beyond, new addresses are counted together under
# ``OTHER_ADDRESSES``, so many addresses refused at once cost neither memory nor lines without bound
MAX_PAIRS = 1024
OTHER_ADDRESSES = "(other addresses)"


@dataclass
class _Pair:
    last_line: float | None = None  # when this pair's last line was written
    unlogged: int = 0  # refusals since


class RefusalLog:
    """``note(bound, address)`` at each refusal; ``flush()`` now and then writes what waits."""

    def __init__(
        self,
        logger: logging.Logger = log,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
        max_pairs: int = MAX_PAIRS,
    ) -> None:
        self.log, self.window_s, self.clock, self.max_pairs = logger, window_s, clock, max_pairs
        self.pairs: dict[tuple[str, str], _Pair] = {}

    def note(self, bound: str, address: str) -> None:
        """One refusal of ``address`` by ``bound``: a line now if the pair had none within the window."""
        now = self.clock()
        key = (bound, address)
        if key not in self.pairs and len(self.pairs) >= self.max_pairs:
            key = (bound, OTHER_ADDRESSES)
        pair = self.pairs.setdefault(key, _Pair())
        pair.unlogged += 1
        if pair.last_line is None or now - pair.last_line >= self.window_s:
            self._write(key, pair, now)

    def flush(self, everything: bool = False) -> None:
        """Write the refusals counted once their window passed (``everything``: all, as the front stops)."""
        now = self.clock()
        for key, pair in list(self.pairs.items()):
            due = everything or now - pair.last_line >= self.window_s
            if pair.unlogged and due:
                self._write(key, pair, now)
            elif due:
                del self.pairs[key]

    def _write(self, key: tuple[str, str], pair: _Pair, now: float) -> None:
        bound, address = key
        times = "1 time" if pair.unlogged == 1 else f"{pair.unlogged} times"
        since = "" if pair.last_line is None else f" in {now - pair.last_line:.0f} s"
        self.log.warning("client %s refused %s%s: %s", address, times, since, bound)
        pair.last_line, pair.unlogged = now, 0


REFUSALS = RefusalLog()  # the front process's own
note_refusal = REFUSALS.note  # a refusal by one of the front's bounds


def note_refused(refusal: RequestRefusedError, address: str) -> None:
    """Count ``refusal`` in the log when one of the front's bounds made it (it names its ``bound``)."""
    if refusal.bound:
        REFUSALS.note(refusal.bound, address)
