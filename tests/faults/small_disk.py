"""A small tmpfs that lives in a private mount namespace of the calling thread, so that it vanishes
with the process however the process ends.

A tmpfs mounted in the host's namespace outlives a test run that is killed before its teardown
(a timeout, ^C twice, an OOM kill): it keeps its filler's pages of RAM and stays mounted under an old
pytest folder that pytest can then never remove. A mount namespace is freed when its last task
leaves it, and so is every mount in it: this thread enters a private one for the mount, and leaves
it again afterwards where the kernel lets it (a thread that started threads of its own since shares
its file-system context with them and cannot move; it stays in the copy, which differs from the
host's only in this mount, unmounted by then). Entering a mount namespace resets the thread's working
folder to that namespace's root, so it is put back: the tests after this one read paths relative to it.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

CLONE_NEWNS = 0x00020000  # <sched.h>: a new mount namespace
_libc = ctypes.CDLL(None, use_errno=True)


class MountUnavailableError(OSError):
    """The tmpfs cannot be mounted here (mounting needs CAP_SYS_ADMIN)."""


def _call(name: str, *args: int) -> None:
    if getattr(_libc, name)(*args) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{name}: {os.strerror(errno)}")


def _mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise MountUnavailableError(f"mount {' '.join(args)}: {done.stderr.strip()}")


@contextmanager
def private_tmpfs(mount: Path, size_bytes: int) -> Iterator[Path]:
    """``mount`` (an existing folder) holding a ``size_bytes`` tmpfs that only this thread and the
    processes it starts see. Raises ``MountUnavailableError`` where it cannot be mounted."""
    original = os.open("/proc/thread-self/ns/mnt", os.O_RDONLY)
    working = os.open(".", os.O_RDONLY)
    try:
        try:
            _call("unshare", CLONE_NEWNS)
        except OSError as error:
            raise MountUnavailableError(str(error)) from error
        try:
            # the copy keeps the host's propagation: a shared mount would carry ours back to the host
            _mount("--make-rprivate", "/")
            _mount("-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(mount))
            yield mount
        finally:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)
            with suppress(OSError):  # threads started meanwhile share its context: it stays in the copy
                _call("setns", original, CLONE_NEWNS)
            os.fchdir(working)  # setns moved it to the namespace's root
    finally:
        os.close(original)
        os.close(working)
