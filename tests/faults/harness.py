"""Helpers of the fault matrix (``conftest.py`` holds the fixtures): URLs, the orphan check, the
health check, the shared server's revival, and the inputs good traffic sends."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from client.connection import connect
from server import TritonServer
from server.__main__ import STATE
from server.proc_stat import stat_fields
from server.records import read_record
from server.stubs import STUB_NAME
from server.supervisor import death_cause
from soak import raw_http

PROTOCOLS = ("http", "grpc")
GOOD_MODEL = "trivial"  # the model good traffic runs on while a fault is injected elsewhere
PORT_KINDS = ("http", "grpc", "metrics")


def start_arguments() -> list[str]:
    """Port flags for ``python -m server start`` that let its launcher pick the ports (0 is "pick").

    Ports a test picked itself could be bound by another process (any outgoing connection takes an
    ephemeral port) before the server binds them, and such a start fails with EADDRINUSE; the launcher
    picks ports of its own again when that happens. The ports it got are in ``.run/server.json``.
    """
    return [f"--{kind}-port=0" for kind in PORT_KINDS]


def recorded_port_arguments(checkout: Path) -> list[str]:
    """Port flags that start a server again on the ports the server of ``checkout`` was recorded on."""
    state = read_record(checkout / STATE)
    return [f"--{kind}-port={_port(state[kind])}" for kind in PORT_KINDS]


def _port(address: str) -> int:
    """The port of a recorded address: ``host:port``, or a URL (the metrics one)."""
    return urlsplit(address if "//" in address else f"//{address}").port


def url(server: TritonServer, protocol: str) -> str:
    return server.http_url if protocol == "http" else server.grpc_url


def _processes() -> list[tuple[int, int, str]]:
    """(pid, ppid, command line) of every process."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if (fields := stat_fields(entry / "stat")) is not None:
            found.append((int(entry.name), int(fields[1]), command))
    return found


def orphans(server: TritonServer) -> list[str]:
    """Stubs of ``server`` not parented by it, and its ``/dev/shm`` regions that no live stub uses."""
    stubs = [  # the server's and the fronts' command lines name the prefix too
        (pid, ppid, cmd)
        for pid, ppid, cmd in _processes()
        if server.shm_prefix in cmd and STUB_NAME.decode() in cmd.split(" ", 1)[0]
    ]
    alive = server.process is not None and server.process.poll() is None
    problems = [f"stub {pid} has parent {ppid}" for pid, ppid, _ in stubs if not alive or ppid != server.pid]
    for region in Path("/dev/shm").glob(f"{server.shm_prefix}*"):
        if not any(region.name in cmd for _, _, cmd in stubs):
            problems.append(f"/dev/shm/{region.name} has no stub")
    return problems


def assert_live_and_ready(server: TritonServer) -> None:
    for protocol in PROTOCOLS:
        with connect(protocol, url(server, protocol)) as client:
            assert client.is_server_live(), f"not live over {protocol}"
            assert client.is_server_ready(), f"not ready over {protocol}"


def revive(server: TritonServer) -> str | None:
    """Start ``server`` again if it has died, as the supervisor does under ``make serve``; why it died
    (``death_cause``), or None while it runs.

    The fault tests share one server, and Triton 2.51 can die of its own faults (a stub starved past its
    health window: docs/SERVING.md, "Starved stubs"). Without this, every test after such a death
    failed too. The dead server is reaped (its stray stubs and ``/dev/shm`` regions removed) and started
    again on the same ports, its fronts kept; the caller still fails the test it died in, with the cause.
    """
    process = server.process
    if process is None or process.poll() is None:
        return None
    cause = death_cause(process.returncode, server.log_tail(60))
    server.reap()
    server.start()
    return cause


def trivial_inputs(protocol: str, rows: int = 1) -> list:
    module = httpclient if protocol == "http" else grpcclient
    tensor = module.InferInput("x", [rows, 16], "FP32")
    tensor.set_data_from_numpy(np.ones((rows, 16), np.float32))
    return [tensor]


@dataclass
class Traffic:
    """Good requests sent in a loop while a fault happens; ``ok + failed == sent``."""

    sent: int = 0
    ok: int = 0
    failures: list[str] = field(default_factory=list)


def content_length(head: bytes | str) -> int:
    """The ``Content-Length`` of an HTTP response's head."""
    text = head.decode("latin-1") if isinstance(head, bytes) else head
    return int(re.search(r"(?i)content-length: *(\d+)", text).group(1))


def exchange(
    server: TritonServer,
    raw: bytes,
    responses: int = 1,
    timeout: float = 30,
    sent: threading.Event | None = None,
) -> list[tuple]:
    """Send raw bytes on one connection (``sent`` is set once they are all written); the first
    ``responses`` HTTP answers as (status, body), by ``soak.raw_http``'s rule: a request that got
    none fails the test, saying why."""
    host, port = server.http_url.rsplit(":", 1)
    replies = raw_http.pipelined((host, int(port)), raw, responses, timeout, sent)
    assert not replies[-1].failure, f"request {len(replies)} got no answer: {replies[-1].failure}"
    return [(reply.status, reply.body) for reply in replies]


def raw_request(
    body: bytes,
    content_type: str = "application/json",
    length: int | None = None,
    path: str = "/v2/models/recommender/infer",
) -> bytes:
    """A POST as raw bytes, so a test controls framing (Content-Type, a Content-Length that lies)."""
    size = len(body) if length is None else length
    return (
        f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {size}\r\n\r\n"
    ).encode() + body
