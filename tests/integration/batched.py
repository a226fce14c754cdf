"""A group of concurrent requests sent again until Triton's statistics show it ran as one batch.

Whether requests sent together from threads arrive inside one batcher window (300 ms on the test
models) is the host's timing: on a loaded host a thread can start late, its request misses the
window, and a test about batch mates then checks answers of batches that never formed. So a test
sends its group until the models' ``batch_stats`` show the executions it needs (``TRIES`` at most, a
guard for a batcher that never merges, not a rate), holds every try's answers to its checks, and
fails naming the batch that never formed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from counted import stats_counting

from client.stats import model_stats

TRIES = 10
Answers = TypeVar("Answers")


@dataclass(frozen=True)
class Batch:
    """An execution of ``size`` inferences at ``model`` that one send of the group must show, once
    the model has counted the group's ``inferences``."""

    model: str
    size: int
    inferences: int


def until_batched(
    send: Callable[[], Answers], client: Any, protocol: str, batches: Sequence[Batch]
) -> list[Answers]:
    """Every try's answers (``send``'s), up to the first try whose statistics show each of
    ``batches``; AssertionError after ``TRIES`` tries without, with what each try formed."""
    answers: list[Answers] = []
    formed: list[dict[str, list[int]]] = []
    for _ in range(TRIES):
        before = {b.model: model_stats(client, protocol, b.model) for b in batches}
        answers.append(send())
        sizes = {
            b.model: sorted(stats_counting(client, protocol, b.model, before[b.model], b.inferences).batches)
            for b in batches
        }
        formed.append(sizes)
        if all(b.size in sizes[b.model] for b in batches):
            return answers
    wanted = ", ".join(f"{b.size} at {b.model}" for b in batches)
    raise AssertionError(f"the group never ran as one batch ({wanted}) in {TRIES} tries; formed: {formed}")
