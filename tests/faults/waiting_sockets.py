"""What waits unread in a stopped tritonserver's sockets: the positive sign that a request reached it.

A tritonserver stopped with SIGSTOP reads nothing, but the kernel goes on accepting its connections
and queueing what arrives on them. So each ESTABLISHED connection to Triton's port with bytes in its
receive queue is a request a front forwarded and Triton holds unanswered; a test waits for that,
with a hang guard, instead of taking "no answer for a while" to mean the same.
"""

from __future__ import annotations

from pathlib import Path

ESTABLISHED = "01"  # the state column of /proc/net/tcp
TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))


def waiting_at(port: int) -> dict[str, int]:
    """Unread bytes on each ESTABLISHED connection to local ``port`` that has any, by the peer's
    address (as ``/proc/net/tcp`` writes it: unique among the connections open at once)."""
    waiting: dict[str, int] = {}
    for table in TABLES:
        for line in table.read_text().splitlines()[1:]:
            local, peer, state, queues = line.split()[1:5]
            unread = int(queues.split(":")[1], 16)
            if state == ESTABLISHED and int(local.rsplit(":", 1)[1], 16) == port and unread:
                waiting[peer] = unread
    return waiting
