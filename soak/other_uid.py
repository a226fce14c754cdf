"""Another local user's client for the invariant fuzz: a relay process that runs as uid 65534.

The fronts key every shared-memory region by the uid at the other end of the connection, so a second
client must be a second uid. This module is started as root (``OtherUser``), imports all it needs,
drops to ``NOBODY`` (the interpreter's own files are then out of its reach, as the environment lives in
``/root``), and from then on does what the fuzz asks on its stdin, one JSON line each, answering on its
stdout: create a file in ``/dev/shm`` (owned by that uid), send an HTTP request over a plain socket, or
make a unary gRPC call with bytes in and bytes out. The fuzz builds every request itself; the relay
only gives it the other uid's sockets.

``exchange`` (one HTTP request on its own connection, within an overall time limit) is also the fuzz's
own HTTP client, so both users speak to the HTTP front the same way.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

NOBODY = 65534
SERVICE = "/inference.GRPCInferenceService/"
MAX_MESSAGE = 256 << 20  # the client never refuses what the front should (its own limit is 64 MiB)
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE),
    ("grpc.max_receive_message_length", MAX_MESSAGE),
]


@dataclass(frozen=True)
class HttpReply:
    """What came back: a status and body, or ``failure`` (``hang``, ``reset: ...``) when no answer did."""

    status: int = 0
    body: bytes = b""
    elapsed_s: float = 0.0
    failure: str = ""


def exchange(
    address: tuple[str, int], method: str, path: str, body: bytes, headers: dict[str, str], timeout_s: float
) -> HttpReply:
    """One HTTP/1.1 request on its own connection; the answer read to its ``Content-Length`` (or to the
    connection's end). No answer within ``timeout_s`` is a ``hang``; a connection closed or reset
    without one is a ``reset``."""
    start = time.monotonic()
    lines = [f"{method} {path} HTTP/1.1", f"Host: {address[0]}", "Connection: close"]
    lines += [f"{key}: {value}" for key, value in headers.items()]
    lines.append(f"Content-Length: {len(body)}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    answer = b""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.settimeout(timeout_s)
            sock.connect(address)
            # the front may answer (413) and close before it read the whole body: read that answer
            with contextlib.suppress(OSError):
                sock.sendall(head + body)
            while True:
                remaining = timeout_s - (time.monotonic() - start)
                if remaining <= 0:
                    raise TimeoutError
                sock.settimeout(remaining)
                chunk = sock.recv(1 << 20)
                if not chunk:
                    break
                answer += chunk
                reply = _parsed(answer, start)
                if reply is not None:
                    return reply
        except TimeoutError:
            return HttpReply(elapsed_s=time.monotonic() - start, failure="hang")
        except OSError as error:
            return HttpReply(elapsed_s=time.monotonic() - start, failure=f"reset: {error!r}")
    reply = _parsed(answer, start, whole=True)
    return reply or HttpReply(elapsed_s=time.monotonic() - start, failure="reset: closed without an answer")


def _parsed(answer: bytes, start: float, whole: bool = False) -> HttpReply | None:
    """The reply in ``answer`` once it is complete (``whole``: the connection ended, take what came)."""
    head, found, body = answer.partition(b"\r\n\r\n")
    if not found:
        return None
    lines = head.decode("latin-1").split("\r\n")
    try:
        status = int(lines[0].split()[1])
    except (IndexError, ValueError):
        return HttpReply(elapsed_s=time.monotonic() - start, failure=f"reset: not HTTP: {lines[0][:80]!r}")
    length = next(
        (int(v) for k, _, v in (x.partition(":") for x in lines[1:]) if k.lower() == "content-length"), None
    )
    if length is not None and len(body) >= length:
        return HttpReply(status, body[:length], time.monotonic() - start)
    return HttpReply(status, body, time.monotonic() - start) if whole else None


def grpc_call(
    channel: grpc.Channel, method: str, request: bytes, timeout_s: float
) -> tuple[str, str, bytes, float]:
    """(status code name, details, response bytes, seconds) of a unary call: what both users' clients
    answer with."""
    start = time.monotonic()
    try:
        response = channel.unary_unary(SERVICE + method)(request, timeout=timeout_s)
        return "OK", "", response, time.monotonic() - start
    except grpc.RpcError as error:
        return error.code().name, error.details() or "", b"", time.monotonic() - start


def _serve(http_address: tuple[str, int], channel: grpc.Channel) -> None:
    """The relay's loop (as ``NOBODY``): one command a line on stdin, one answer a line on stdout."""
    for line in sys.stdin:
        command = json.loads(line)
        operation, data = command["op"], base64.b64decode(command["data"])
        if operation == "exit":
            print(json.dumps({"bye": True}), flush=True)
            break
        answer: dict = {"body": b""}
        if operation == "create":
            descriptor = os.open(f"/dev/shm/{command['name']}", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            os.write(descriptor, data)
            os.close(descriptor)
        elif operation == "http":
            arguments = (command["method"], command["path"], data, command["headers"], command["timeout_s"])
            answer = dataclasses.asdict(exchange(http_address, *arguments))
        else:  # grpc: bytes in, bytes out
            code, details, body, seconds = grpc_call(channel, command["method"], data, command["timeout_s"])
            answer = {"code": code, "details": details, "body": body, "elapsed_s": seconds}
        print(json.dumps({**answer, "body": base64.b64encode(answer["body"]).decode()}), flush=True)
    channel.close()


class OtherUser:
    """The relay, seen from the fuzz: ``create``, ``http`` and ``grpc`` run as uid ``NOBODY``. Needs
    root (``available()``); ``close()`` ends it."""

    def __init__(self, http_url: str, grpc_url: str) -> None:
        root = Path(__file__).resolve().parents[1]
        environment = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "soak.other_uid", http_url, grpc_url],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=root, env=environment,
        )  # fmt: skip

    @staticmethod
    def available() -> bool:
        return os.getuid() == 0

    def _ask(self, command: dict, data: bytes = b"") -> dict:
        """``command`` with ``data`` to the relay, and its answer (bytes travel base64, both ways)."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps({**command, "data": base64.b64encode(data).decode()}) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the other user's relay exited ({self.process.poll()})")
        answer = json.loads(line)
        return {**answer, "body": base64.b64decode(answer.get("body", ""))}

    def create(self, name: str, data: bytes) -> None:
        self._ask({"op": "create", "name": name}, data)

    def http(
        self, method: str, path: str, body: bytes, headers: dict[str, str], timeout_s: float
    ) -> HttpReply:
        command = {"op": "http", "method": method, "path": path, "headers": headers, "timeout_s": timeout_s}
        return HttpReply(**self._ask(command, body))

    def grpc(self, method: str, request: bytes, timeout_s: float) -> tuple[str, str, bytes, float]:
        answer = self._ask({"op": "grpc", "method": method, "timeout_s": timeout_s}, request)
        return answer["code"], answer["details"], answer["body"], answer["elapsed_s"]

    def close(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(OSError, RuntimeError, ValueError):
                self._ask({"op": "exit"})
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def main(argv: list[str]) -> None:
    """As root: everything imported above and the channel made (grpc imports more as it does); then
    drop to ``NOBODY`` and relay (its first call connects, as that uid)."""
    http_url, grpc_url = argv
    host, port = http_url.rsplit(":", 1)
    channel = grpc.insecure_channel(grpc_url, options=GRPC_OPTIONS)
    channel.unary_unary(SERVICE + "ServerLive")
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    _serve((host, int(port)), channel)


if __name__ == "__main__":
    main(sys.argv[1:])
