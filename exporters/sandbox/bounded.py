"""``python -m exporters.sandbox.bounded AS CPU FSIZE NOFILE -- COMMAND...``: COMMAND under rlimits.

The sandbox's first program lowers its soft and hard limits and becomes COMMAND, which, with every
capability dropped, can never raise them again. Not the parent's ``preexec_fn``: in a process with
threads (torch's) it can deadlock. Standard library only, imported before anything from the archive.
"""

from __future__ import annotations

import os
import resource
import sys

CPU_GRACE_S = 5  # SIGXCPU at the soft limit, SIGKILL this much later (a handler cannot outlive it)


def main(argv: list[str]) -> None:
    separator = argv.index("--")
    address_space, cpu_s, file_size, open_files = (int(v) for v in argv[:separator])
    for limit, value in (
        (resource.RLIMIT_AS, (address_space, address_space)),
        (resource.RLIMIT_CPU, (cpu_s, cpu_s + CPU_GRACE_S)),
        (resource.RLIMIT_FSIZE, (file_size, file_size)),
        (resource.RLIMIT_NOFILE, (open_files, open_files)),
        (resource.RLIMIT_CORE, (0, 0)),
    ):
        resource.setrlimit(limit, value)  # soft and hard, for good: children inherit them
    command = argv[separator + 1 :]
    os.execv(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
