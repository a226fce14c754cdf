"""What the shared-memory fault tests share (test_shared_memory.py, test_shm_copies.py): the client
module of a protocol, the server's live stubs and one of their regions, and another local user as a
client. That user is a forked child that drops to uid 65534 (root only; tests skip otherwise),
creates its own ``/dev/shm`` region and registers it through the HTTP front; it talks HTTP over a raw
socket, since after ``setuid`` it can import nothing more (no access to /root, where the environment
lives)."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from server import TritonServer
from server.stubs import server_stubs

NOBODY = 65534
SHM = Path("/dev/shm")
root_only = pytest.mark.skipif(os.getuid() != 0, reason="plays another user with setuid: needs root")


def client_module(protocol: str):
    return httpclient if protocol == "http" else grpcclient


def stub_pids(server: TritonServer) -> set[int]:
    return {stub.pid for stub in server_stubs(server.pid or 0) if stub.alive}


def a_stub_region(server: TritonServer) -> Path:
    """The ``/dev/shm`` region of one of ``trivial``'s live stubs."""
    stub = next(stub for stub in server_stubs(server.pid or 0) if stub.alive and stub.model == "trivial")
    return Path("/dev/shm") / stub.shm_region


@contextmanager
def client_file(name: str, size: int, at: int = 0, values: np.ndarray | None = None) -> Iterator[Path]:
    """``/dev/shm/name`` of ``size`` zero bytes, ``values`` written at ``at``; removed afterwards."""
    path = SHM / name
    data = bytearray(size)
    if values is not None:
        data[at : at + values.nbytes] = values.tobytes()
    path.write_bytes(bytes(data))
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


def raw_http(address: tuple[str, int], method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
    """One HTTP request over a plain socket (what a forked child that lost access to /root can still
    do); returns the status and the body."""
    payload = json.dumps(body).encode() if body is not None else b""
    with socket.socket() as sock:  # not create_connection: its name lookup imports a codec
        sock.settimeout(30)
        sock.connect(address)
        head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        sock.sendall(f"{head}Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode() + payload)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1]), answer.partition(b"\r\n\r\n")[2]


@dataclass
class OtherUser:
    """What the other user saw: the status its register got and, once the block ended, whether its
    region was still registered (its own status request listed it)."""

    registered: int = 0
    kept: bool | None = None


@contextmanager
def other_users_region(server: TritonServer, name: str, data: bytes) -> Iterator[OtherUser]:
    """Another user (uid 65534) creates ``/dev/shm/name`` holding ``data``, registers it under
    ``name`` through the HTTP front and keeps it registered until the block ends."""
    host, port = server.http_url.rsplit(":", 1)
    address = (host, int(port))
    ready_read, ready_write = os.pipe()
    done_read, done_write = os.pipe()
    child = os.fork()
    if child == 0:
        status, kept, region = 0, b"0", f"/v2/systemsharedmemory/region/{name}"
        try:
            os.setuid(NOBODY)
            descriptor = os.open(f"/dev/shm/{name}", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            os.write(descriptor, data)
            os.close(descriptor)
            registration = {"key": f"/{name}", "byte_size": len(data)}
            status, _ = raw_http(address, "POST", f"{region}/register", registration)
        finally:
            os.write(ready_write, str(status).encode())
            os.read(done_read, 1)
            code, listed = raw_http(address, "GET", f"{region}/status")
            if code == 200 and f'"name":"{name}"'.encode() in listed.replace(b" ", b""):
                kept = b"1"
            raw_http(address, "POST", f"{region}/unregister")
            os.unlink(f"/dev/shm/{name}")
            os.write(ready_write, kept)
            os._exit(0)
    user = OtherUser()
    try:
        user.registered = int(os.read(ready_read, 16) or 0)
        yield user
    finally:
        os.write(done_write, b"x")
        os.waitpid(child, 0)
        user.kept = os.read(ready_read, 1) == b"1"
