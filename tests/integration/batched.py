"""A group of concurrent requests that Triton holds until it forms one batch, and the check that it did.

Whether requests sent together from threads arrive inside one batcher window is the host's timing: on
a loaded host a thread starts late, its request misses the window, and a test about batch mates then
checks batches that never formed. So the models these tests send groups to (``conftest.py``) prefer
a batch of exactly ``GROUP`` and wait up to ``HOLD_US`` for it: the batcher runs the group as soon
as its last request is queued, however late that request was sent. ``HOLD_US`` is a hang guard, not
a window a test must hit. ``sent_as_batches`` still reads the batches from Triton's ``batch_stats``,
so a test fails naming what formed if the models ever stop holding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from counted import stats_counting

from client.stats import model_stats

GROUP = 4  # the preferred batch size of the holding models, and so the size of a test's group
HOLD_US = 60_000_000  # how long they wait for a group to fill before running what came
HOLDING = {"mode": "dynamic", "max_queue_delay_us": HOLD_US, "preferred_batch_sizes": [GROUP]}
Answers = TypeVar("Answers")


@dataclass(frozen=True)
class Batch:
    """An execution of ``size`` inferences at ``model`` that the group's send must show, once the
    model has counted the group's ``inferences``."""

    model: str
    size: int
    inferences: int


def sent_as_batches(
    send: Callable[[], Answers], client: Any, protocol: str, batches: Sequence[Batch]
) -> Answers:
    """``send``'s answers, once Triton's statistics show each of ``batches`` among the executions it
    caused; AssertionError with the batch sizes that formed otherwise."""
    before = {b.model: model_stats(client, protocol, b.model) for b in batches}
    answers = send()
    formed = {
        b.model: sorted(stats_counting(client, protocol, b.model, before[b.model], b.inferences).batches)
        for b in batches
    }
    missing = [f"{b.size} at {b.model}" for b in batches if b.size not in formed[b.model]]
    assert not missing, f"the group did not run as one batch ({', '.join(missing)}); formed: {formed}"
    return answers
