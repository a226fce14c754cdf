"""Another local user for the invariant fuzz, since the fronts key every region by the peer's uid: a relay
that imports all it needs as root (``/root`` is out of the other uid's reach), drops to uid 65534, and
makes the calls the fuzz asks for, one JSON line each, so both users are judged alike."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import encodings.idna  # noqa: F401  (raw_http's connect looks the host up with it: import it as root)
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import grpc

from soak.raw_http import HttpReply, Request, address, exchange

NOBODY = 65534
SERVICE = "/inference.GRPCInferenceService/"
MAX_MESSAGE = 256 << 20  # the client never refuses what the front should (its own limit is 64 MiB)
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE),
    ("grpc.max_receive_message_length", MAX_MESSAGE),
]


def grpc_call(
    channel: grpc.Channel,
    method: str,
    request: bytes,
    timeout_s: float,
    compression: grpc.Compression | None = None,
) -> tuple[str, str, bytes, float]:
    """(status code name, details, response bytes, seconds) of a unary call, for both users' clients."""
    start = time.monotonic()
    try:
        response = channel.unary_unary(SERVICE + method)(request, timeout=timeout_s, compression=compression)
        return "OK", "", response, time.monotonic() - start
    except grpc.RpcError as error:
        return error.code().name, error.details() or "", b"", time.monotonic() - start


def _serve(http_address: tuple[str, int], channel: grpc.Channel) -> None:
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
            headers = [(name, value) for name, value in command["headers"]]  # pairs, as JSON lists
            request = Request(command["method"], command["path"], headers, data)
            answer = dataclasses.asdict(exchange(http_address, request, command["timeout_s"]))
        else:  # grpc: bytes in, bytes out
            code, details, body, seconds = grpc_call(channel, command["method"], data, command["timeout_s"])
            answer = {"code": code, "details": details, "body": body, "elapsed_s": seconds}
        print(json.dumps({**answer, "body": base64.b64encode(answer["body"]).decode()}), flush=True)
    channel.close()


class OtherUser:
    """The relay, seen from the fuzz: ``create``, ``http`` and ``grpc`` run as ``NOBODY``. Needs root."""

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

    def http(self, request: Request, timeout_s: float) -> HttpReply:
        command = {"op": "http", "method": request.method, "path": request.path, "headers": request.headers}
        return HttpReply(**self._ask({**command, "timeout_s": timeout_s}, request.body))

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
    """As root: everything imported and the channel made; then relay as ``NOBODY``."""
    http_url, grpc_url = argv
    http_address = address(http_url)
    channel = grpc.insecure_channel(grpc_url, options=GRPC_OPTIONS)
    channel.unary_unary(SERVICE + "ServerLive")
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    _serve(http_address, channel)


if __name__ == "__main__":
    main(sys.argv[1:])
