"""Server statistics once they count what the client saw answered.

Triton records a request's statistics as it releases the request, just after the response has left,
so a read right after the last answer can miss the last batches, and more often the busier the
machine. Tests that compare the server's counts with the client's wait for them here (a hang guard,
not a speed check: the counts themselves are what is asserted).
"""

from __future__ import annotations

import time
from typing import Any

from client.stats import ModelStats, model_stats

WAIT_S = 60.0


def stats_counting(client: Any, protocol: str, model: str, before: ModelStats, inferences: int) -> ModelStats:
    """``model``'s statistics since ``before``, read once they count at least ``inferences`` more
    inferences (or after ``WAIT_S``: the caller's assertion then says what is missing)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        delta = model_stats(client, protocol, model) - before
        if delta.inferences >= inferences or time.monotonic() > deadline:
            return delta
        time.sleep(0.05)
