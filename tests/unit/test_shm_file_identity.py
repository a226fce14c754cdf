"""Shared-memory ownership by file, not by name (fault matrix rows 43 and 44): a hard link, a server
region renamed under a client's name, or a file swapped in after the check is refused. No server:
this process plays the server whose mappings (``/proc/<pid>/maps``) say which file a name stands for."""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from server.fronts import shm_ownership
from server.fronts.refusal import Refusal, RequestRefusedError
from server.fronts.shm_ownership import Client, RegionRules


@pytest.fixture
def rules(tmp_path: Path) -> RegionRules:
    return RegionRules("srv_", lambda: set(), server_pid=os.getpid, directory=tmp_path)


def _file(rules: RegionRules, name: str, size: int = mmap.PAGESIZE) -> Path:
    path = rules.directory / name
    path.write_bytes(b"\0" * size)
    return path


@pytest.fixture
def mapped(rules: RegionRules) -> Iterator[list[mmap.mmap]]:
    """Files mapped the way Triton maps a registered region; unmapped at the end."""
    maps: list[mmap.mmap] = []
    yield maps
    for region in maps:
        region.close()


def _map(maps: list[mmap.mmap], path: Path) -> None:
    with open(path, "r+b") as handle:
        maps.append(mmap.mmap(handle.fileno(), mmap.PAGESIZE))


def _refused(match: str):
    return pytest.raises(RequestRefusedError, match=match)


def test_a_hard_link_is_refused_at_register_and_use(rules: RegionRules) -> None:
    me = Client(os.getuid())
    _file(rules, "mine")
    shm_ownership.check_register(rules, me, "mine", "/mine", 0, 64)
    os.link(rules.directory / "mine", rules.directory / "alias")
    for name in ("mine", "alias"):
        with _refused("has 2 links") as refused:
            shm_ownership.check_register(rules, me, name, f"/{name}", 0, 64)
        assert refused.value.kind == Refusal.FORBIDDEN
        with _refused("has 2 links"):
            shm_ownership.check_use(rules, me, name, 0, 64)
    shm_ownership.check_unregister(rules, me, "mine")  # unmapping stays possible


def test_a_server_region_renamed_to_a_clients_name_is_refused(rules: RegionRules) -> None:
    me = Client(os.getuid())
    region = _file(rules, "srv_stub_region")
    shm_ownership.remember_server_regions(rules)  # the fronts do this every second
    region.rename(rules.directory / "innocent")
    with _refused("is the server's own IPC region 'srv_stub_region' under another name"):
        shm_ownership.check_register(rules, me, "innocent", "/innocent", 0, 64)
    with _refused("is the server's own IPC region 'srv_stub_region' under another name"):
        shm_ownership.check_use(rules, me, "innocent", 0, 64)


def test_a_file_swapped_in_before_the_server_opened_it_is_refused(rules: RegionRules, mapped) -> None:
    """The front checked the client's own file; before Triton opened the name, a hard link to a server
    region took its place; Triton mapped the server region; the link was removed and the client's file
    put back. The mapping still names the link, now deleted: refused (measured without the rule: an
    output written there and the server died of SIGSEGV)."""
    me = Client(os.getuid())
    own = _file(rules, "r1")
    shm_ownership.check_register(rules, me, "r1", "/r1", 0, 64)
    own.rename(rules.directory / "aside")
    server_region = _file(rules, "srv_stub_region")
    os.link(server_region, rules.directory / "r1")
    _map(mapped, rules.directory / "r1")  # what Triton's register does
    (rules.directory / "r1").unlink()
    (rules.directory / "aside").rename(rules.directory / "r1")
    with _refused("is registered for a file that no longer exists"):
        shm_ownership.check_use(rules, me, "r1", 0, 64)
