"""Bursts of concurrent requests against a model's queue policy, until one meets a full queue.

Whether a burst finds the queue full is the host's timing: on a loaded host the threads send more
slowly, and a whole burst can arrive a few at a time and find room. So a test sends bursts until one
has a request refused by the queue, ``BURSTS`` at most (a guard for a queue that never refuses, not a
rate), and holds every answer of every burst to "answered or refused by the queue".
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

BURSTS = 10


def bursts_until_refused(one: Callable[[int], str], pool: ThreadPoolExecutor, size: int) -> list[str]:
    """The outcomes (``one``'s: "ok", "rejected" or what else came back) of bursts of ``size`` requests
    sent through ``pool``, up to the first burst with a "rejected" in it, or ``BURSTS`` bursts."""
    outcomes: list[str] = []
    for _ in range(BURSTS):
        burst = list(pool.map(one, range(size)))
        outcomes += burst
        if "rejected" in burst:
            break
    return outcomes
