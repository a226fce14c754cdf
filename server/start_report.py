"""What a start that timed out waited for: the models Triton's log shows loading and neither loaded nor
failed, and each one's stub. 2.51's Python backend waits without a timeout for a stub's first message
(docs/SERVING.md, Triton 2.51's own limits), so a stub that died or hung before it holds the start
forever; the error names it rather than leaving the reader the log tail alone."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from server.install import ServerError
from server.proc_stat import read_proc, stat_fields
from server.stubs import Stub, server_stubs

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class StubDiedAtStartError(ServerError):
    """A start that timed out holding a stub that died before its first message: a fault of the
    moment, not of the repository, so ``TritonServer.start`` starts tritonserver again."""


LOADING = re.compile(r'"loading: (.+):\d+"')
SETTLED = re.compile(r"\"(?:successfully loaded|failed to load) '([^']+)'")


def loading_models(log_lines: Iterable[str]) -> list[str]:
    """The models whose last load Triton's log shows begun (``loading: <name>:<version>``) and not yet
    ended (``successfully loaded '<name>'`` or ``failed to load '<name>' ...``), in log order."""
    loading: dict[str, None] = {}
    for line in log_lines:
        if begun := LOADING.search(line):
            loading[begun.group(1)] = None
        elif ended := SETTLED.search(line):
            loading.pop(ended.group(1), None)
    return list(loading)


def _times(pid: int) -> str:
    """How long ago ``pid`` started and the CPU it used ("" once gone): a stub that waits on its own
    start uses CPU, one hung before its first message barely any."""
    fields, uptime = stat_fields(pid), read_proc("/proc/uptime")
    if fields is None or uptime is None:
        return ""
    age = float(uptime.split()[0]) - int(fields[19]) / CLOCK_TICKS  # starttime: stat's field 22, in ticks
    cpu = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return f", started {age:.0f} s ago, {cpu:.1f} s of CPU"


def other_children(server_pid: int, stubs: Iterable[Stub]) -> list[str]:
    """tritonserver's children that are not stubs, described: 2.51 forks, the child execs ``bash -c``,
    which execs the stub, so a start stuck between fork and exec shows here and nowhere else."""
    known = {stub.pid for stub in stubs}
    described = []
    for entry in os.listdir("/proc"):
        fields = stat_fields(int(entry)) if entry.isdigit() and int(entry) not in known else None
        name = read_proc(f"/proc/{entry}/comm") if fields and int(fields[1]) == server_pid else None
        if fields and name is not None:  # None: another's child, or gone meanwhile
            described.append(f"pid {entry} ({name.decode().strip()}), state {fields[0]}{_times(int(entry))}")
    return described


def still_loading(server_pid: int | None, log_lines: Iterable[str]) -> tuple[str, bool]:
    """One line per model still loading with its live stubs (pid, instance, /proc state, age, CPU used)
    or that none of it runs, and the exited stubs Triton has not reaped (an exited process has no argv
    left to name its model by), "" when the log shows none loading; and whether a stub died before its
    first message, which 2.51 waits on for good: a loading model has no live stub while tritonserver
    holds an exited one (never while each has a live stub, however slow or stuck)."""
    models = loading_models(log_lines)
    if not models:
        return "", False
    stubs = server_stubs(server_pid) if server_pid is not None else []
    lines = []
    unserved = False
    for model in models:
        own = [
            f"stub pid {stub.pid} ({stub.instance}) alive, state {stub.state}{_times(stub.pid)}"
            for stub in stubs
            if stub.alive and stub.model == model
        ]
        unserved |= not own
        lines.append(f"  {model}: " + ("; ".join(own) or "no stub of it runs"))
    if exited := [str(stub.pid) for stub in stubs if not stub.alive]:
        lines.append(f"  exited stubs not reaped by tritonserver: pid {', '.join(exited)}")
    if server_pid is not None and (others := other_children(server_pid, stubs)):
        lines.append(f"  tritonserver's other children (not yet a stub): {'; '.join(others)}")
    return "models still loading:\n" + "\n".join(lines), unserved and bool(exited)
