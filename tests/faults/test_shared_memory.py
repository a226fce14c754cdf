"""Fault matrix: what a client may register as system shared memory (rows 24, 42 and 43). Measured
without the fronts: any client, without a key, registered a Python-backend stub's own IPC region
(named in the stub's command line), read another client's request tensor through it, and crashed
tritonserver by having an output written into it; the stubs' regions were world-readable. Now the
fronts keep their own table of regions (Triton never maps a client's file: test_shm_copies.py), a
client registers only a file its own uid owns with one link, never a stub's, and the stubs' regions
are owner-only.

Other users are played by a forked child that drops to uid 65534 (``shm_harness``; root only).
"""

from __future__ import annotations

import os
import select
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import numpy as np
import pytest
import tritonclient.utils.shared_memory as shm
from harness import PROTOCOLS, url
from shm_harness import NOBODY, a_stub_region, client_module, other_users_region, root_only, stub_pids
from tritonclient.utils import InferenceServerException

from client.__main__ import main as client_main
from client.connection import connect
from server import TritonServer
from server.stubs import server_stubs

pytestmark = pytest.mark.integration
REFUSED = {"http": "403", "grpc": "StatusCode.PERMISSION_DENIED"}
INVALID = {"http": "400", "grpc": "StatusCode.INVALID_ARGUMENT"}
NOT_FOUND = {"http": "404", "grpc": "StatusCode.NOT_FOUND"}
REPORT_GUARD_S = 60  # a hang guard: how long a child polling /dev/shm may take to report its counts


def _x_from_region(protocol: str, region: str, offset: int = 0) -> list:
    tensor = client_module(protocol).InferInput("x", [1, 16], "FP32")
    tensor.set_shared_memory(region, 64, offset=offset)
    return [tensor]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_servers_own_region_cannot_be_registered(
    fault_server: TritonServer, good_traffic, protocol
) -> None:
    client = connect(protocol, url(fault_server, protocol))
    stubs = server_stubs(fault_server.pid or 0)
    region = next(stub.shm_region for stub in stubs if stub.alive and stub.model == "recommender")
    with good_traffic():
        with pytest.raises(InferenceServerException) as error:
            client.register_system_shared_memory(region, f"/{region}", 4096)
        assert error.value.status() == REFUSED[protocol]
        assert "is the server's own IPC region" in error.value.message()
        with pytest.raises(InferenceServerException) as error:  # nor under another name
            client.register_system_shared_memory("stolen", f"/{region}", 4096)
        assert error.value.status() == REFUSED[protocol]
        assert "is the server's own IPC region" in error.value.message()
    status = client.get_system_shared_memory_status(**({"as_json": True} if protocol == "grpc" else {}))
    # HTTP lists the regions, gRPC maps them by name; other tests on this shared server (the fuzz)
    # may hold regions of their own
    registered = {r["name"] for r in status} if isinstance(status, list) else set(status.get("regions", {}))
    assert not registered & {region, "stolen"}, status


def test_the_stubs_regions_are_owner_only(fault_server: TritonServer) -> None:
    regions = sorted(Path("/dev/shm").glob(f"{fault_server.shm_prefix}*"))
    assert regions
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in regions} == {p.name: "0o600" for p in regions}


@root_only
def test_another_user_cannot_open_the_stubs_regions(fault_server: TritonServer) -> None:
    region = next(Path("/dev/shm").glob(f"{fault_server.shm_prefix}*"))
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        os.setuid(NOBODY)
        try:
            os.close(os.open(region, os.O_RDONLY))
            os.write(write, b"opened")
        except PermissionError:
            os.write(write, b"refused")
        os._exit(0)
    os.waitpid(child, 0)
    assert os.read(read, 16) == b"refused"


@root_only
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_another_users_region_is_neither_registered_nor_read(fault_server: TritonServer, protocol) -> None:
    """The owner may register and use its region; another client may not register its file under any
    name nor run a model on the tensor in it (measured without the fronts: the other client got the
    owner's tensor back through ``trivial``)."""
    name = f"victim_{protocol}_{os.getpid()}"
    secret = np.arange(16, dtype=np.float32).reshape(1, 16)
    stubs = stub_pids(fault_server)
    with other_users_region(fault_server, name, secret.tobytes()) as owner:
        assert owner.registered == 200, "the owner's own region must register"
        client = connect(protocol, url(fault_server, protocol))
        for registered_as in ("stolen", name):
            with pytest.raises(InferenceServerException) as error:
                client.register_system_shared_memory(registered_as, f"/{name}", 64)
            assert error.value.status() == REFUSED[protocol]
            assert f"belongs to uid {NOBODY}, not to this client" in error.value.message()
        with pytest.raises(InferenceServerException) as error:
            client.infer("trivial", _x_from_region(protocol, name))
        assert error.value.status() == NOT_FOUND[protocol]  # a name of its uid's alone
        assert f"Unable to find shared memory region: '{name}'" in error.value.message()
    assert owner.kept
    assert stub_pids(fault_server) == stubs


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_client_keeps_its_shared_memory_path(fault_server: TritonServer, protocol: str) -> None:
    """``python -m client infer --shm system`` through the fronts: its own regions, as before."""
    argv = ["--protocol", protocol, "--url", url(fault_server, protocol), "infer", "--model", "recommender"]
    assert client_main([*argv, "--shm", "system"]) == 0


@contextmanager
def own_region(client, name: str, size: int) -> Iterator[object]:
    handle = shm.create_shared_memory_region(name, f"/{name}", size)
    try:
        client.register_system_shared_memory(name, f"/{name}", size)
        yield handle
    finally:
        try:
            client.unregister_system_shared_memory(name)
        finally:
            shm.destroy_shared_memory_region(handle)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_region_cut_short_after_registration_is_refused(fault_server: TritonServer, protocol) -> None:
    """A client truncating its own registered region: Triton 2.51 would read past the end of the file
    (SIGBUS, the whole server gone); the front's read comes back short, and it says so."""
    client = connect(protocol, url(fault_server, protocol))
    name = f"cut_{protocol}_{os.getpid()}"
    stubs = stub_pids(fault_server)
    with own_region(client, name, 1 << 20):
        os.truncate(f"/dev/shm/{name}", 64)
        with pytest.raises(InferenceServerException) as error:
            client.infer("trivial", _x_from_region(protocol, name, offset=1 << 19))
        assert error.value.status() == INVALID[protocol]
        assert "holds 64 bytes, fewer than the 524352 this input needs" in error.value.message()
    assert stub_pids(fault_server) == stubs


def _open_as_nobody_while_starting(prefix: str, results_fd: int, stop_fd: int) -> None:
    """In a forked child: as uid 65534, open every ``/dev/shm/<prefix>*`` as soon as it appears, until
    the parent writes to ``stop_fd``, and once more after that; report ``opened refused`` counts on
    ``results_fd``."""
    opened = refused = 0
    os.setuid(NOBODY)
    os.set_blocking(stop_fd, False)
    tried: set[str] = set()
    stopping = False
    while not stopping:
        with suppress(BlockingIOError):
            stopping = bool(os.read(stop_fd, 1))
        for entry in os.scandir("/dev/shm"):
            if entry.name.startswith(prefix) and entry.name not in tried:
                try:
                    os.close(os.open(entry.path, os.O_RDONLY))
                    opened += 1
                    tried.add(entry.name)
                except PermissionError:
                    refused += 1  # tried again: it must stay refused while the server starts
                except FileNotFoundError:
                    continue
    os.write(results_fd, f"{opened} {refused}".encode())


@root_only
def test_the_stubs_regions_are_private_from_creation(spec_data, tmp_path: Path) -> None:
    """Another user polling ``/dev/shm`` while the server starts never opens a stub's region (fault
    matrix row 42). Before, Boost created them 0644 and the launcher tightened them only once the
    server was ready: an open descriptor from that window outlived the chmod."""
    from resilience_fixtures import build_small_repository, explicit_options

    repository = build_small_repository(spec_data, tmp_path / "repository", pipeline=False)
    server = TritonServer(explicit_options(repository, tmp_path / "server"))
    results_read, results_write = os.pipe()
    stop_read, stop_write = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            _open_as_nobody_while_starting(server.shm_prefix, results_write, stop_read)
        finally:
            os._exit(0)
    try:
        with server:
            regions = sorted(Path("/dev/shm").glob(f"{server.shm_prefix}*"))
            os.write(stop_write, b"x")  # one more pass, over the ready server's regions, then the counts
            assert select.select([results_read], [], [], REPORT_GUARD_S)[0], "the child never reported"
            opened, refused = map(int, os.read(results_read, 64).split())
    finally:
        os.write(stop_write, b"x")
        os.waitpid(child, 0)
    assert regions and opened == 0 and refused > 0, (regions, opened, refused)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_hard_link_to_a_stubs_region_is_refused(fault_server: TritonServer, good_traffic, protocol) -> None:
    """Fault matrix row 43. Measured without the rule: Triton registered the link and mapped the
    stub's region through it; an output written there, and the server died of SIGSEGV."""
    client = connect(protocol, url(fault_server, protocol))
    name = f"link_{protocol}_{os.getpid()}"
    link = Path("/dev/shm") / name
    pid, stubs = fault_server.pid, stub_pids(fault_server)
    with good_traffic():
        os.link(a_stub_region(fault_server), link)
        try:
            with pytest.raises(InferenceServerException) as error:
                client.register_system_shared_memory(name, f"/{name}", 4096)
            assert error.value.status() == REFUSED[protocol]
            assert "has 2 links" in error.value.message()
        finally:
            link.unlink()
    assert (fault_server.pid, stub_pids(fault_server)) == (pid, stubs)
    client.close()  # here, not in whichever thread collects it (gevent)
