"""What tritonserver's log says about how it exited after SIGTERM.

Triton 2.51 unloads its models at SIGTERM and counts, once a second until its exit timeout, the model
versions it still holds (``Found N live models``); past the timeout it exits 1 (``failed to stop
server: Internal - Exit timeout expired``). After a drain nothing it counts is live: each is the old
version of a model the watchdog reloaded after its stub died with requests in flight. The Python
backend leaves those requests' response factories undeleted when the stub is gone, and each holds
its model version, so no API can unload it (docs/SERVING.md, Triton 2.51's own limits).
"""

from __future__ import annotations

import re

EXIT_TIMEOUT = "Exit timeout expired"
HELD_COUNT = re.compile(r"Found (\d+) live models")


def exit_timeout_expired(log_text: str) -> bool:
    """Whether tritonserver gave up waiting at its exit timeout (and so exited 1)."""
    return EXIT_TIMEOUT in log_text


def versions_held(log_text: str) -> int | None:
    """Triton's last count of the model versions it still held while it exited; None if it logged none."""
    counts = HELD_COUNT.findall(log_text)
    return int(counts[-1]) if counts else None


def exit_timeout_explained(log_text: str) -> str | None:
    """One line for people when tritonserver exited 1 at its exit timeout, saying why; else None."""
    if not exit_timeout_expired(log_text):
        return None
    held = versions_held(log_text)
    if not held:
        return "tritonserver exited with status 1: its exit timeout expired; its log says what it waited on"
    return (
        f"tritonserver exited with status 1: its exit timeout expired with {held} model version(s) it never "
        "unloads; each is the old version of a model the watchdog reloaded after its stub died with "
        "requests in flight (docs/SERVING.md, Triton 2.51's own limits)"
    )
