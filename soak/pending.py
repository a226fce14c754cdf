"""Triton's own count of a model's waiting requests, read through a fault's run: what the fronts let
reach Triton, whatever the clients' timing."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request

from server.watchdog import model_progress

READ_EVERY_S = 0.05


def _counts(metrics_url: str, model: str) -> tuple[float, float]:
    with urllib.request.urlopen(metrics_url, timeout=5) as answer:
        return model_progress(answer.read().decode(errors="replace")).get(model, (0.0, 0.0))


def pending(metrics_url: str, model: str) -> float:
    """The requests ``model`` has waiting in Triton now (those its instances run are not counted)."""
    return _counts(metrics_url, model)[0]


def progress(metrics_url: str, model: str) -> float:
    """Triton's count of ``model``'s executions, successes and failures so far: it grew, a request ran."""
    return _counts(metrics_url, model)[1]


class PendingWatch:
    """Reads Triton's metrics every ``READ_EVERY_S`` in a thread while a block runs: the most ``model``
    requests Triton had waiting, and how many reads answered (so an empty watch is not a pass)."""

    def __init__(self, metrics_url: str, model: str) -> None:
        self.metrics_url, self.model, self.most, self.reads = metrics_url, model, 0.0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> PendingWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def read_again(self, guard_s: float = 60.0) -> None:
        """Wait for a read begun after this call (``guard_s``: a hang guard, not a bound), so what the block
        left waiting is counted however short it was."""
        wanted, give_up = self.reads + 2, time.monotonic() + guard_s  # the read under way began before
        while self.reads < wanted and time.monotonic() < give_up:
            time.sleep(READ_EVERY_S)

    def _watch(self) -> None:
        while not self._stop.wait(READ_EVERY_S):
            try:
                waiting = pending(self.metrics_url, self.model)
            except (urllib.error.URLError, OSError):
                continue
            self.reads += 1
            self.most = max(self.most, waiting)
