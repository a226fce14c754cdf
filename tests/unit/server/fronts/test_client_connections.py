"""The connection shares both fronts count (fault matrix row 73): per address, in all, and below the
process's open-file limit."""

from __future__ import annotations

import resource

import pytest

from server.fronts.client_connections import ClientConnections, ConnectionShare, descriptor_room


def test_an_address_beyond_its_share_is_refused_and_others_are_not():
    clients = ClientConnections(ConnectionShare(per_address=2, total=10))
    assert clients.admit("10.0.0.1") is None and clients.admit("10.0.0.1") is None
    refusal = clients.admit("10.0.0.1")
    assert refusal is not None and "(10.0.0.1) already holds 2 connections" in refusal
    assert clients.admit("10.0.0.2") is None
    clients.release("10.0.0.1")
    assert clients.admit("10.0.0.1") is None  # a closed connection's place is free again
    assert clients.count == 3 and clients.open == {"10.0.0.1": 2, "10.0.0.2": 1}


def test_all_clients_together_are_bounded():
    clients = ClientConnections(ConnectionShare(per_address=5, total=3))
    assert all(clients.admit(f"10.0.0.{n}") is None for n in range(3))
    refusal = clients.admit("10.0.0.9")
    assert refusal is not None and "already holds 3 client connections, all it takes" in refusal


@pytest.mark.parametrize(("soft", "room"), [(20_000, 8192), (4096, 3072), (1024, 512), (64, 32)])
def test_the_total_stays_below_the_open_file_limit(monkeypatch: pytest.MonkeyPatch, soft: int, room: int):
    monkeypatch.setattr(resource, "getrlimit", lambda _: (soft, soft))
    assert descriptor_room(8192) == room
