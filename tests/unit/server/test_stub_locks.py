"""``server.stub_locks``: which robust mutexes a process owns, read from a shared-memory region laid
out as glibc lays out a locked robust ``pthread_mutex_t`` (lock word and owner field hold the TID)."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from server.stub_locks import FUTEX_TID_MASK, owned_mutexes


@pytest.fixture
def region() -> Iterator[str]:
    name = f"test_stub_locks_{uuid.uuid4().hex}"
    yield name
    Path("/dev/shm", name).unlink(missing_ok=True)


def write_region(name: str, words: dict[int, int]) -> None:
    data = np.zeros(1 << 12, np.uint32)
    for offset, value in words.items():
        data[offset // 4] = value
    data.tofile(Path("/dev/shm", name))


def test_a_mutex_locked_by_one_of_the_threads_is_owned(region: str) -> None:
    tid = threading.get_native_id()
    write_region(region, {184: tid | 0x80000000, 192: tid})  # waiters bit set: still the owner
    assert owned_mutexes(os.getpid(), region) == [184]


def test_a_word_that_only_looks_like_a_thread_id_is_not_a_mutex(region: str) -> None:
    tid = threading.get_native_id()
    write_region(region, {184: tid, 192: 7, 4000: 1})  # an owner field that disagrees
    assert owned_mutexes(os.getpid(), region) == []


def test_a_mutex_of_another_process_or_a_missing_region_is_not_owned(region: str) -> None:
    other = 1 if os.getpid() != 1 else 2
    write_region(region, {184: other & FUTEX_TID_MASK, 192: other})
    assert owned_mutexes(os.getpid(), region) == []
    assert owned_mutexes(os.getpid(), region + "_gone") == []
