"""A front process of a test's own before a running Triton, with flags the test chooses (small shares,
a short message time) where the fault server's fronts keep the defaults its other tests rely on."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from server.admin import KEY_ENV
from server.ports import free_port

START_GUARD_S = 60  # how long a front may take to listen before the test fails: a hang guard


@contextlib.contextmanager
def own_front(
    module: str,
    upstream: str,
    log_path: Path,
    flags: Sequence[str] = (),
    admin_key: str = "",
    variables: Mapping[str, str] | None = None,
) -> Iterator[int]:
    """``module``'s front before ``upstream`` with ``flags`` (and ``admin_key``, which a Triton behind
    fronts needs to take inferences; ``variables``, set in its environment): its port once its log says
    it listens (a port taken between ``free_port()`` and its bind is left for another); stopped
    afterwards."""
    added = {**(variables or {}), **({KEY_ENV: admin_key} if admin_key else {})}
    environment = {**os.environ, **added} if added else None
    deadline = time.monotonic() + START_GUARD_S
    while True:
        port = free_port()
        command = [sys.executable, "-m", module, f"--listen=127.0.0.1:{port}", f"--upstream={upstream}"]
        with open(log_path, "wb") as log_file:
            front = subprocess.Popen(
                [*command, *flags], stdout=log_file, stderr=subprocess.STDOUT, env=environment
            )
        listening = f"front on 127.0.0.1:{port}"
        while front.poll() is None and listening not in log_path.read_text():
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        if front.poll() is None:
            break
        assert time.monotonic() < deadline, log_path.read_text()
    try:
        yield port
    finally:
        front.terminate()
        front.wait(timeout=30)
