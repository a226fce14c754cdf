"""``Caller`` frees every shared-memory region on every path: real regions in ``/dev/shm``, a client
that fails where a server would (no server here)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from perf.measure.target import Caller, Target


class FakeClient:
    """Registers regions until ``fail_register_at``; unregistering fails when ``server_gone``."""

    def __init__(self, fail_register_at: int | None = None, server_gone: bool = False) -> None:
        self.fail_register_at, self.server_gone = fail_register_at, server_gone
        self.registered: list[str] = []
        self.attempted: list[str] = []  # every region asked for, registered or not
        self.closed = False

    async def register_system_shared_memory(self, name: str, key: str, byte_size: int) -> None:
        self.attempted.append(name)
        if len(self.registered) == self.fail_register_at:
            raise RuntimeError("register failed")
        self.registered.append(name)

    async def unregister_system_shared_memory(self, name: str) -> None:
        if self.server_gone:
            raise ConnectionError("server is gone")
        self.registered.remove(name)

    async def close(self) -> None:
        self.closed = True


def _caller(client: FakeClient) -> Caller:
    target = Target("m", "localhost:1", {"x": np.zeros((2, 3), np.float32)}, {"y": 4}, shared_memory=True)
    return Caller(target, 0.0, slots=3, connect=lambda target, slots: client)


def live(names: list[str]) -> set[str]:
    """Which of the regions named exist in ``/dev/shm`` now."""
    return {name for name in names if Path("/dev/shm", name).exists()}


def test_a_failed_registration_frees_what_was_made() -> None:
    client = FakeClient(fail_register_at=2)

    async def enter() -> None:
        async with _caller(client):
            pass

    with pytest.raises(RuntimeError, match="register failed"):
        asyncio.run(enter())
    assert len(client.attempted) == 3 and live(client.attempted) == set()
    assert client.registered == [] and client.closed


def test_a_dead_server_does_not_leak_the_remaining_regions() -> None:
    client = FakeClient(server_gone=True)

    async def run() -> None:
        async with _caller(client):
            assert len(live(client.attempted)) == 4  # the input pool and one output region per slot

    asyncio.run(run())
    assert len(client.attempted) == 4 and live(client.attempted) == set() and client.closed
