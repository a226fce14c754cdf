"""Fault matrix: system shared memory. Measured without the fronts: any client,
without a key, registered a Python-backend stub's own IPC region (named in the stub's command line),
read another client's request tensor through it, and crashed tritonserver by having an output
written into it; the stubs' regions were world-readable. Now a client names only regions its own uid
owns, never a stub's; a region cut short or replaced under its registered name is refused, not a
SIGBUS or a window onto someone else's memory; and the stubs' regions are owner-only.

Other users are played by a forked child that drops to uid 65534 (root only; skipped otherwise): it
talks HTTP over a raw socket, as nothing else may be imported after it loses access to /root.
"""

from __future__ import annotations

import json
import mmap
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from harness import PROTOCOLS, trivial_inputs, url
from tritonclient.utils import InferenceServerException

from client.__main__ import main as client_main
from client.connection import connect
from server import TritonServer
from server.stubs import server_stubs

pytestmark = pytest.mark.integration
NOBODY = 65534
REFUSED = {"http": "403", "grpc": "StatusCode.PERMISSION_DENIED"}
INVALID = {"http": "400", "grpc": "StatusCode.INVALID_ARGUMENT"}
root_only = pytest.mark.skipif(os.getuid() != 0, reason="plays another user with setuid: needs root")


def _module(protocol: str):
    return httpclient if protocol == "http" else grpcclient


def _x_from_region(protocol: str, region: str, offset: int = 0) -> list:
    tensor = _module(protocol).InferInput("x", [1, 16], "FP32")
    tensor.set_shared_memory(region, 64, offset=offset)
    return [tensor]


def _stub_pids(server: TritonServer) -> set[int]:
    return {stub.pid for stub in server_stubs(server.pid or 0) if stub.alive}


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
        assert error.value.status() == INVALID[protocol]
        assert "key must be '/stolen'" in error.value.message()
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


def _raw_post(address: tuple[str, int], path: str, body: dict | None = None) -> tuple[int, bytes]:
    """A POST over a plain socket (what a forked child that lost access to /root can still do)."""
    payload = json.dumps(body).encode() if body is not None else b""
    with socket.socket() as sock:  # not create_connection: its name lookup imports a codec
        sock.settimeout(30)
        sock.connect(address)
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        sock.sendall(f"{head}Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode() + payload)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1]), answer.partition(b"\r\n\r\n")[2]


@contextmanager
def other_users_region(server: TritonServer, name: str, values: np.ndarray) -> Iterator[int]:
    """Another user (uid 65534, a forked child) creates ``/dev/shm/name`` holding ``values``,
    registers it through the HTTP front and keeps it registered until the block ends; yields the
    status its own register got."""
    host, port = server.http_url.rsplit(":", 1)
    address = (host, int(port))
    ready_read, ready_write = os.pipe()
    done_read, done_write = os.pipe()
    child = os.fork()
    if child == 0:
        status = 0
        try:
            os.setuid(NOBODY)
            descriptor = os.open(f"/dev/shm/{name}", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            os.write(descriptor, values.tobytes())
            os.close(descriptor)
            status, _ = _raw_post(address, f"/v2/systemsharedmemory/region/{name}/register", {
                "key": f"/{name}", "byte_size": values.nbytes,
            })  # fmt: skip
        finally:
            os.write(ready_write, str(status).encode())
            os.read(done_read, 1)
            _raw_post(address, f"/v2/systemsharedmemory/region/{name}/unregister")
            os.unlink(f"/dev/shm/{name}")
            os._exit(0)
    try:
        yield int(os.read(ready_read, 16) or 0)
    finally:
        os.write(done_write, b"x")
        os.waitpid(child, 0)


@root_only
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_another_users_region_is_neither_registered_nor_read(fault_server: TritonServer, protocol) -> None:
    """The owner may register and use its region; another client may not register it under any name
    nor run a model on the tensor in it (measured without the fronts: the other client got the
    owner's tensor back through ``trivial``)."""
    name = f"victim_{protocol}_{os.getpid()}"
    secret = np.arange(16, dtype=np.float32).reshape(1, 16)
    stubs = _stub_pids(fault_server)
    with other_users_region(fault_server, name, secret) as owner_status:
        assert owner_status == 200, "the owner's own region must register"
        client = connect(protocol, url(fault_server, protocol))
        with pytest.raises(InferenceServerException) as error:
            client.register_system_shared_memory("stolen", f"/{name}", 64)
        assert error.value.status() == INVALID[protocol]
        with pytest.raises(InferenceServerException) as error:
            client.register_system_shared_memory(name, f"/{name}", 64)
        assert error.value.status() == REFUSED[protocol]
        assert f"belongs to uid {NOBODY}, not to this client" in error.value.message()
        with pytest.raises(InferenceServerException) as error:
            client.infer("trivial", _x_from_region(protocol, name))
        assert error.value.status() == REFUSED[protocol]
        assert f"belongs to uid {NOBODY}" in error.value.message()
    assert _stub_pids(fault_server) == stubs


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
    (SIGBUS, the whole server gone); the front checks the file's size on every use."""
    client = connect(protocol, url(fault_server, protocol))
    name = f"cut_{protocol}_{os.getpid()}"
    stubs = _stub_pids(fault_server)
    with own_region(client, name, 1 << 20):
        os.truncate(f"/dev/shm/{name}", 64)
        with pytest.raises(InferenceServerException) as error:
            client.infer("trivial", _x_from_region(protocol, name, offset=1 << 19))
        assert error.value.status() == INVALID[protocol]
        assert "exceeds the file's 64 bytes" in error.value.message()
    assert _stub_pids(fault_server) == stubs


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_registered_name_is_no_window_onto_a_deleted_region(fault_server: TritonServer, protocol) -> None:
    """A client that dies without unregistering leaves its memory mapped under its name; a new file of
    that name must not read it (measured without the fronts: the old tensor came back)."""
    client = connect(protocol, url(fault_server, protocol))
    name = f"stale_{protocol}_{os.getpid()}"
    path = Path(f"/dev/shm/{name}")
    handle = shm.create_shared_memory_region(name, f"/{name}", mmap.PAGESIZE)
    try:
        shm.set_shared_memory_region(handle, [np.full((1, 16), 7.0, np.float32)])
        client.register_system_shared_memory(name, f"/{name}", mmap.PAGESIZE)
        path.unlink()  # the client is gone; its registration stays
        path.write_bytes(b"\0" * mmap.PAGESIZE)  # a new file under the old name
        with pytest.raises(InferenceServerException) as error:
            client.infer("trivial", _x_from_region(protocol, name))
        assert error.value.status() == REFUSED[protocol]
        assert "registered for a file that no longer exists" in error.value.message()
        client.unregister_system_shared_memory(name)  # the new file's owner may clear the name
    finally:
        shm.destroy_shared_memory_region(handle)
        path.unlink(missing_ok=True)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_unregistering_every_region_needs_the_admin_key(fault_server: TritonServer, protocol) -> None:
    client = connect(protocol, url(fault_server, protocol))
    with pytest.raises(InferenceServerException) as error:
        client.unregister_system_shared_memory()
    assert error.value.status() == REFUSED[protocol]


def _open_as_nobody_while_starting(prefix: str, results_fd: int, stop_fd: int) -> None:
    """In a forked child: as uid 65534, open every ``/dev/shm/<prefix>*`` as soon as it appears, until
    the parent writes to ``stop_fd``; report ``opened refused`` counts on ``results_fd``."""
    opened = refused = 0
    os.setuid(NOBODY)
    os.set_blocking(stop_fd, False)
    tried: set[str] = set()
    while True:
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
        try:
            if os.read(stop_fd, 1):
                break
        except BlockingIOError:
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
            time.sleep(0.5)
            regions = sorted(Path("/dev/shm").glob(f"{server.shm_prefix}*"))
    finally:
        os.write(stop_write, b"x")
        os.waitpid(child, 0)
    opened, refused = map(int, os.read(results_read, 64).split())
    assert regions and opened == 0 and refused > 0, (regions, opened, refused)


def _a_stub_region(server: TritonServer) -> Path:
    stub = next(stub for stub in server_stubs(server.pid or 0) if stub.alive and stub.model == "trivial")
    return Path("/dev/shm") / stub.shm_region


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_hard_link_to_a_stubs_region_is_refused(fault_server: TritonServer, good_traffic, protocol) -> None:
    """Fault matrix row 43. Measured without the rule: Triton registered the link and mapped the
    stub's region through it; an output written there, and the server died of SIGSEGV."""
    client = connect(protocol, url(fault_server, protocol))
    name = f"link_{protocol}_{os.getpid()}"
    link = Path("/dev/shm") / name
    pid, stubs = fault_server.pid, _stub_pids(fault_server)
    with good_traffic():
        os.link(_a_stub_region(fault_server), link)
        try:
            with pytest.raises(InferenceServerException) as error:
                client.register_system_shared_memory(name, f"/{name}", 4096)
            assert error.value.status() == REFUSED[protocol]
            assert "has 2 links" in error.value.message()
        finally:
            link.unlink()
    assert (fault_server.pid, _stub_pids(fault_server)) == (pid, stubs)
    client.close()  # here, not in whichever thread collects it (gevent)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_stubs_region_renamed_over_a_registered_one_is_refused(
    fault_server: TritonServer, good_traffic, protocol
) -> None:
    """Fault matrix row 44: the client's own region passes at registration; then a stub's region is
    renamed over it. Its name, owner and link count look like the client's; its device and inode are
    the server's: every use is refused, the stub keeps its region."""
    client = connect(protocol, url(fault_server, protocol))
    name = f"renamed_{protocol}_{os.getpid()}"
    pid, stubs = fault_server.pid, _stub_pids(fault_server)
    with good_traffic(), own_region(client, name, 4096):
        region = _a_stub_region(fault_server)
        region.rename(Path("/dev/shm") / name)
        try:
            for use in ("input", "output"):
                inputs = _x_from_region(protocol, name)
                outputs = None
                if use == "output":
                    inputs = trivial_inputs(protocol)
                    outputs = [_module(protocol).InferRequestedOutput("y")]
                    outputs[0].set_shared_memory(name, 64)
                with pytest.raises(InferenceServerException) as error:
                    client.infer("trivial", inputs, outputs=outputs)
                assert error.value.status() == REFUSED[protocol], use
                assert "is the server's own IPC region" in error.value.message(), use
        finally:
            (Path("/dev/shm") / name).rename(region)
            Path(f"/dev/shm/{name}").write_bytes(b"\0" * 4096)  # for own_region's cleanup
    assert (fault_server.pid, _stub_pids(fault_server)) == (pid, stubs)
    client.close()  # here, not in whichever thread collects it (gevent)


RACE_S = 15.0  # unfixed, the server died within about 3 s of this race on an idle machine


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_region_truncated_while_triton_copies_does_not_kill_the_server(
    fault_server: TritonServer, good_traffic, protocol
) -> None:
    """Fault matrix row 45: a client cuts its own region short and restores it, over and over, while
    its requests have outputs copied into the region's last bytes. The fronts check the size before
    they forward; Triton copies later, and the copy into a truncated file was a SIGBUS that killed
    the server. Now the copy lands on a private page (``server/shm_private.c``): that client loses
    its output, the server and every other client carry on."""
    client = connect(protocol, url(fault_server, protocol))
    name, size = f"cut_mid_copy_{protocol}_{os.getpid()}", 1 << 16
    pid, stubs = fault_server.pid, _stub_pids(fault_server)
    output = _module(protocol).InferRequestedOutput("y")
    output.set_shared_memory(name, 64, offset=size - 64)
    # the race runs on good traffic's model too: the server's count includes it
    with good_traffic(server_count=False), own_region(client, name, size):
        descriptor = os.open(f"/dev/shm/{name}", os.O_RDWR)
        stop = threading.Event()

        def cut_and_restore() -> None:
            while not stop.is_set():
                os.ftruncate(descriptor, 0)
                os.ftruncate(descriptor, size)

        cutter = threading.Thread(target=cut_and_restore, daemon=True)
        cutter.start()
        answered = refused = 0
        deadline = time.monotonic() + RACE_S
        try:
            while time.monotonic() < deadline and fault_server.process.poll() is None:
                try:
                    client.infer("trivial", trivial_inputs(protocol), outputs=[output])
                    answered += 1
                except InferenceServerException as error:
                    assert "exceeds the file's" in error.message(), error.message()  # the front's check
                    refused += 1
        finally:
            stop.set()
            cutter.join(timeout=10)
            os.close(descriptor)
    assert fault_server.process.poll() is None, f"tritonserver died after {answered + refused} requests"
    assert answered > 0 and refused > 0, (answered, refused)  # both sides of the race were hit
    assert (fault_server.pid, _stub_pids(fault_server)) == (pid, stubs)
    client.close()  # here, not in whichever thread collects it (gevent)
