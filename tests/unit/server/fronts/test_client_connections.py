"""The connection shares both fronts count (fault matrix row 73): per address, in all, and below the
process's open-file limit."""

from __future__ import annotations

import resource
from pathlib import Path
from unittest import mock

import pytest
from aiohttp.test_utils import make_mocked_request

from server.fronts.client_connections import (
    RESERVED_FDS,
    ClientConnections,
    ConnectionShare,
    descriptor_room,
    peer_address,
    raise_open_file_limit,
)
from server.fronts.client_regions import MAX_REGIONS, FrontRegions, ServerRegions
from server.fronts.http_front import client_address


def test_an_address_beyond_its_share_is_refused_and_others_are_not():
    clients = ClientConnections(ConnectionShare(per_address=2, total=10))
    assert clients.admit("10.0.0.1") is None and clients.admit("10.0.0.1") is None
    refusal = clients.admit("10.0.0.1")
    assert refusal is not None and "(10.0.0.1) already holds 2 connections" in refusal
    assert clients.admit("10.0.0.2") is None
    clients.release("10.0.0.1")
    assert clients.admit("10.0.0.1") is None  # a closed connection's place is free again
    assert clients.count == 3 and clients.by_address == {"10.0.0.1": 2, "10.0.0.2": 1}


def test_all_clients_together_are_bounded():
    clients = ClientConnections(ConnectionShare(per_address=5, total=3))
    assert all(clients.admit(f"10.0.0.{n}") is None for n in range(3))
    refusal = clients.admit("10.0.0.9")
    assert refusal is not None and "already holds 3 client connections, all it takes" in refusal


@pytest.mark.parametrize(("soft", "room"), [(20_000, 8192), (4096, 3072), (1024, 512), (64, 32)])
def test_the_total_stays_below_the_open_file_limit(monkeypatch: pytest.MonkeyPatch, soft: int, room: int):
    monkeypatch.setattr(resource, "getrlimit", lambda _: (soft, soft))
    assert descriptor_room(8192) == room


WANTED = 8192 + RESERVED_FDS + MAX_REGIONS  # what a front with the default shares asks for


class _Limits:
    """A stand-in for the process's RLIMIT_NOFILE, as ``resource`` reads and sets it."""

    def __init__(self, soft: int, hard: int, settable: bool = True) -> None:
        self.soft, self.hard, self.settable = soft, hard, settable

    def get(self, _: int) -> tuple[int, int]:
        return self.soft, self.hard

    def set(self, _: int, limits: tuple[int, int]) -> None:
        if not self.settable:
            raise ValueError("not allowed to raise the current limit")
        self.soft, self.hard = limits


@pytest.mark.parametrize(
    ("soft", "hard", "raised", "room"),
    [
        (1024, 524_288, WANTED, 8192),  # what the front asks for, no more
        (1024, 4096, 4096, 3072),  # the hard limit is the most
        (1024, resource.RLIM_INFINITY, WANTED, 8192),
        (20_000, 20_000, 20_000, 8192),  # already enough: never lowered
        (resource.RLIM_INFINITY, resource.RLIM_INFINITY, resource.RLIM_INFINITY, 8192),
    ],
)
def test_a_front_raises_its_soft_open_file_limit_toward_its_total(
    monkeypatch: pytest.MonkeyPatch, soft: int, hard: int, raised: int, room: int
):
    """Row 73: a soft limit below what the front asks for (every connection, its own descriptors and a
    full region table) is raised to it, up to the hard limit, so the documented 8,192 connections hold
    where the hard limit allows (before: a soft limit of 1,024 cut the total to 512)."""
    limits = _Limits(soft, hard)
    monkeypatch.setattr(resource, "getrlimit", limits.get)
    monkeypatch.setattr(resource, "setrlimit", limits.set)
    assert raise_open_file_limit(WANTED) == raised
    assert (limits.soft, limits.hard) == (raised, hard)
    assert descriptor_room(8192) == room


def test_a_soft_limit_that_cannot_be_raised_is_kept(monkeypatch: pytest.MonkeyPatch):
    limits = _Limits(1024, 524_288, settable=False)
    monkeypatch.setattr(resource, "getrlimit", limits.get)
    monkeypatch.setattr(resource, "setrlimit", limits.set)
    assert raise_open_file_limit(WANTED) == 1024 and descriptor_room(8192) == 512


@pytest.mark.parametrize(
    ("soft", "trusted", "room"), [(10_000, False, 6928), (10_000, True, 8192), (11_264, False, 8192)]
)
def test_the_room_leaves_a_full_region_table_its_descriptors(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, soft: int, trusted: bool, room: int
):
    """Row 73: a front that keeps its clients' regions (not ``--trusted-shared-memory``) may hold 2,048
    descriptors of them; its connections get the limit less those and its own 1,024, so a full table and
    every connection stay below it (before: a limit of 10,000 took 8,192 connections beside them)."""
    limits = _Limits(soft, soft)
    monkeypatch.setattr(resource, "getrlimit", limits.get)
    monkeypatch.setattr(resource, "setrlimit", limits.set)
    regions = FrontRegions(ServerRegions("srv_", set, tmp_path), 1 << 20, trusted)
    assert regions.descriptors == (0 if trusted else MAX_REGIONS)
    clients = ClientConnections(ConnectionShare(), regions.descriptors)
    assert clients.total == room and clients.total + regions.descriptors + RESERVED_FDS <= soft


@pytest.mark.parametrize("peer", [("::ffff:10.0.0.7", 50000, 0, 0), ("10.0.0.7", 50000)])
def test_a_request_counts_against_the_address_its_connection_counts_against(peer: tuple) -> None:
    """A client reaching a dual-stack front as IPv4-mapped IPv6 is one client for its request share and
    refusal lines (``client_address``) and for its connections (``peer_address``): one spelling."""
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda name, default=None: peer if name == "peername" else default
    request = make_mocked_request("POST", "/v2/models/m/infer", transport=transport)
    assert client_address(request) == peer_address(peer) == "10.0.0.7"
