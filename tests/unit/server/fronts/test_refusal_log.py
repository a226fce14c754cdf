"""The fronts' refusals in their log (``server.fronts.refusal_log``), on a clock the test moves: one line
per bound and client address at most every window, each with the count since that pair's last line."""

from __future__ import annotations

import logging
import pickle
from collections.abc import Iterator

import pytest

from server.fronts import refusal_log
from server.fronts.refusal import Refusal, RequestRefusedError
from server.fronts.refusal_log import OTHER_ADDRESSES, RefusalLog

SHARE = "connections beyond its address's share (503 / RESOURCE_EXHAUSTED, fault matrix row 73)"
STREAMS = "calls open beyond its address's share (REFUSED_STREAM, fault matrix row 77)"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


class Lines(logging.Handler):
    """The WARNING lines of the logger the tests' ``RefusalLog`` writes to, as they come."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


LOGGER = logging.getLogger("refusals-under-test")


@pytest.fixture
def lines() -> Iterator[list[str]]:
    handler = Lines()
    LOGGER.addHandler(handler)
    yield handler.lines
    LOGGER.removeHandler(handler)


def _refusals(clock: Clock, **kwargs: int) -> RefusalLog:
    return RefusalLog(LOGGER, window_s=10.0, clock=clock, **kwargs)


def test_a_flood_of_refusals_writes_one_line_per_window_with_its_count(clock: Clock, lines: list[str]):
    refusals = _refusals(clock)
    refusals.note(SHARE, "10.0.0.1")
    assert lines == [f"client 10.0.0.1 refused 1 time: {SHARE}"]  # the first at once
    for _ in range(499):  # within the window: counted, not written
        clock.now += 0.01
        refusals.note(SHARE, "10.0.0.1")
    assert len(lines) == 1
    clock.now = 1010.0
    refusals.note(SHARE, "10.0.0.1")  # the window has passed: the count since the first line
    assert lines[1:] == [f"client 10.0.0.1 refused 500 times in 10 s: {SHARE}"]
    clock.now += 5.0
    refusals.note(SHARE, "10.0.0.1")
    assert len(lines) == 2, "one line per window, the next window counts from the last line"


def test_each_bound_and_address_has_its_own_line_and_count(clock: Clock, lines: list[str]):
    refusals = _refusals(clock)
    for address, bound in [("10.0.0.1", SHARE), ("10.0.0.2", SHARE), ("10.0.0.1", STREAMS)] * 3:
        refusals.note(bound, address)
    assert lines == [
        f"client 10.0.0.1 refused 1 time: {SHARE}",
        f"client 10.0.0.2 refused 1 time: {SHARE}",
        f"client 10.0.0.1 refused 1 time: {STREAMS}",
    ]
    clock.now += 12.0
    refusals.flush()
    assert sorted(lines[3:]) == sorted(
        [
            f"client 10.0.0.1 refused 2 times in 12 s: {SHARE}",
            f"client 10.0.0.2 refused 2 times in 12 s: {SHARE}",
            f"client 10.0.0.1 refused 2 times in 12 s: {STREAMS}",
        ]
    )


def test_refusals_that_stop_are_written_by_flush_once_their_window_passed(clock: Clock, lines: list[str]):
    """A burst that ends within a window still gets its count written: by the front's once-a-second
    ``flush``, and by ``flush(everything=True)`` as the front stops."""
    refusals = _refusals(clock)
    for _ in range(3):
        refusals.note(SHARE, "10.0.0.1")
    clock.now += 9.0
    refusals.flush()
    assert len(lines) == 1, "the window has not passed"
    clock.now += 1.0
    refusals.flush()
    assert lines[1:] == [f"client 10.0.0.1 refused 2 times in 10 s: {SHARE}"]
    refusals.flush()
    assert len(lines) == 2, "nothing new: no line"
    clock.now += 10.0
    refusals.flush()
    assert refusals.pairs == {}, "a pair with nothing to write is forgotten once its window passed"
    refusals.note(SHARE, "10.0.0.1")
    refusals.note(SHARE, "10.0.0.1")
    refusals.flush(everything=True)
    assert lines[2:] == [
        f"client 10.0.0.1 refused 1 time: {SHARE}",
        f"client 10.0.0.1 refused 1 time in 0 s: {SHARE}",
    ]


def test_many_addresses_are_counted_together_beyond_the_pairs_kept(clock: Clock, lines: list[str]):
    refusals = _refusals(clock, max_pairs=4)
    for n in range(100):
        refusals.note(SHARE, f"10.0.1.{n}")
    assert len(refusals.pairs) == 5 and len(lines) == 5
    assert lines[-1] == f"client {OTHER_ADDRESSES} refused 1 time: {SHARE}"
    refusals.flush(everything=True)
    assert lines[-1] == f"client {OTHER_ADDRESSES} refused 95 times in 0 s: {SHARE}"


def test_only_a_refusal_by_one_of_the_fronts_bounds_is_logged(monkeypatch: pytest.MonkeyPatch):
    """A request at fault itself (400 / ``INVALID_ARGUMENT``) gets its clear error and no line; a
    refusal that names the bound it met is counted, and keeps its bound through a body worker's pickle."""
    noted: list[tuple[str, str]] = []
    monkeypatch.setattr(refusal_log.REFUSALS, "note", lambda bound, address: noted.append((bound, address)))
    refusal_log.note_refused(RequestRefusedError("input 'x' is missing"), "10.0.0.1")
    share = RequestRefusedError("this client address already has 64 requests", Refusal.TOO_MANY, "share")
    refusal_log.note_refused(pickle.loads(pickle.dumps(share)), "10.0.0.2")
    assert noted == [("share", "10.0.0.2")]
