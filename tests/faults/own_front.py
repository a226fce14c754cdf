"""A front process of a test's own before a running Triton, with flags the test chooses (small shares,
a short message time) where the fault server's fronts keep the defaults its other tests rely on."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from server.admin import KEY_ENV
from server.fronts.refusal_log import WINDOW_S
from server.ports import free_port

START_GUARD_S = 60  # how long a front may take to listen before the test fails: a hang guard
# a line of the front's refusal log (``server.fronts.refusal_log``): address, count, bound
REFUSAL_LINE = re.compile(
    r"WARNING server\.fronts\.refusal_log: client (\S+) refused (\d+) times?(?: in \d+ s)?: (.*)"
)


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


def refusals_logged(log_path: Path, address: str, bound: str) -> list[int]:
    """The counts of the front's refusal lines for ``address`` whose bound begins with ``bound``, in
    order (the last one written as the front stopped)."""
    found = (REFUSAL_LINE.search(line) for line in log_path.read_text().splitlines())
    return [int(m[2]) for m in found if m and m[1] == address and m[3].startswith(bound)]


def most_refusal_lines(seconds: float) -> int:
    """The most lines one bound and address may take in ``seconds`` of a front's life: the first at once,
    one more per window passed, and the count left as it stops."""
    return 2 + int(seconds // WINDOW_S)
