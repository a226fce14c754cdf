"""``Caller`` frees every shared-memory region on every path, without a server or real regions."""

from __future__ import annotations

import asyncio
import types

import numpy as np
import pytest

from perf.measure import target as target_module
from perf.measure.target import Caller, Target


class FakeClient:
    """Registers regions until ``fail_register_at``; unregistering fails when ``server_gone``."""

    def __init__(self, fail_register_at: int | None = None, server_gone: bool = False) -> None:
        self.fail_register_at, self.server_gone = fail_register_at, server_gone
        self.registered: list[str] = []
        self.closed = False

    async def register_system_shared_memory(self, name: str, key: str, byte_size: int) -> None:
        if len(self.registered) == self.fail_register_at:
            raise RuntimeError("register failed")
        self.registered.append(name)

    async def unregister_system_shared_memory(self, name: str) -> None:
        if self.server_gone:
            raise ConnectionError("server is gone")
        self.registered.remove(name)

    async def close(self) -> None:
        self.closed = True


@pytest.fixture()
def regions(monkeypatch: pytest.MonkeyPatch) -> dict[str, set]:
    """Fake ``shared_memory`` functions recording which regions exist."""
    made: dict[str, set] = {"live": set(), "ever": set()}

    def create(name: str, key: str, byte_size: int) -> str:
        made["live"].add(name)
        made["ever"].add(name)
        return name

    fake = types.SimpleNamespace(
        create_shared_memory_region=create,
        destroy_shared_memory_region=lambda handle: made["live"].remove(handle),
        set_shared_memory_region=lambda handle, arrays: None,
    )
    monkeypatch.setattr(target_module, "shm", fake)
    return made


def _caller(client: FakeClient, monkeypatch: pytest.MonkeyPatch) -> Caller:
    monkeypatch.setattr(target_module.grpc_aio, "InferenceServerClient", lambda url: client)
    target = Target("m", "localhost:1", {"x": np.zeros((2, 3), np.float32)}, {"y": 4}, shared_memory=True)
    return Caller(target, 0.0, slots=3)


def test_a_failed_registration_frees_what_was_made(regions, monkeypatch: pytest.MonkeyPatch) -> None:
    client = FakeClient(fail_register_at=2)

    async def enter() -> None:
        async with _caller(client, monkeypatch):
            pass

    with pytest.raises(RuntimeError, match="register failed"):
        asyncio.run(enter())
    assert len(regions["ever"]) == 3 and regions["live"] == set()
    assert client.registered == [] and client.closed


def test_a_dead_server_does_not_leak_the_remaining_regions(regions, monkeypatch: pytest.MonkeyPatch) -> None:
    client = FakeClient(server_gone=True)

    async def run() -> None:
        async with _caller(client, monkeypatch):
            assert len(regions["live"]) == 4  # the input pool and one output region per slot

    asyncio.run(run())
    assert regions["live"] == set() and client.closed
