"""Run inside the sandbox as ``/in/probe.py MODE [ARGUMENT...]``: what hostile code would try there.

Standard library only (it runs as a script in the sandbox, where only the project's packages and the
environment are visible). ``writes`` and ``network`` send what happened to each attempt as JSON on the
result pipe (``$SANDBOX_RESULT_FD``); the other modes are the ways a program overstays its bounds.

``writes PATH...``: create a file at each path, make ``/`` and each path's folder writable again
(``mount -o remount,rw``), and read ``/etc/passwd``; ``network HOST:PORT...``: connect to each.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import sys
import time

MS_REMOUNT, MS_BIND = 32, 4096
CLONE_NEWUSER = 0x10000000
LIBC = ctypes.CDLL(None, use_errno=True)


def _checked(status: int) -> None:
    if status != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def _try(action) -> str:
    try:
        action()
        return "ok"
    except OSError as error:
        return f"{type(error).__name__}: {error.strerror}"


def _remount(path: str) -> None:
    _checked(LIBC.mount(None, path.encode(), None, MS_REMOUNT | MS_BIND, None))


def writes(paths: list[str]) -> dict[str, str]:
    def create(path: str) -> None:
        with open(path, "w") as handle:
            handle.write("written from the sandbox")

    results = {f"create {p}": _try(lambda p=p: create(p)) for p in paths}
    for folder in ["/", *sorted({os.path.dirname(p) for p in paths})]:
        results[f"remount {folder}"] = _try(lambda f=folder: _remount(f))
    results["read /etc/passwd"] = _try(lambda: open("/etc/passwd").close())
    results["user namespace"] = _try(lambda: _checked(LIBC.unshare(CLONE_NEWUSER)))
    return results


def network(targets: list[str]) -> dict[str, str]:
    def connect(target: str) -> None:
        host, port = target.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5):
            pass

    return {f"connect {t}": _try(lambda t=t: connect(t)) for t in targets}


def main(mode: str, arguments: list[str]) -> None:
    if mode == "memory":  # touch every page, so no lazy allocation hides it
        hog = bytearray(int(arguments[0]))
        hog[::4096] = b"x" * len(range(0, len(hog), 4096))
    elif mode == "cpu":
        while True:
            pass
    elif mode == "sleep":
        time.sleep(float(arguments[0]))
    elif mode == "flood":
        with os.fdopen(int(os.environ["SANDBOX_RESULT_FD"]), "wb") as result:
            while True:
                result.write(b"x" * 65536)
    else:
        found = writes(arguments) if mode == "writes" else network(arguments)
        with os.fdopen(int(os.environ["SANDBOX_RESULT_FD"]), "wb") as result:
            result.write(json.dumps(found).encode())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
