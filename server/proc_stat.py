"""One reader of ``/proc/<pid>/stat``. Its second field is the command name in parentheses, which may
itself hold spaces and parentheses, so the fixed fields are those after the last ``)``."""

from __future__ import annotations

from pathlib import Path

EXITED = ("Z", "X")  # a zombie (exited, not yet reaped by its parent) or a dead task


def stat_fields(stat: int | Path) -> list[str] | None:
    """The fields after the command name of a pid's ``stat`` (or of a ``stat`` file, e.g. a thread's
    ``/proc/<pid>/task/<tid>/stat``): ``[0]`` state, ``[1]`` ppid, ``[11]`` and ``[12]`` utime and stime
    in clock ticks. None once it is gone."""
    path = Path(f"/proc/{stat}/stat") if isinstance(stat, int) else stat
    try:
        text = path.read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def running(pid: int | None, parent: int | None = None) -> bool:
    """Whether ``pid`` runs (an exited one not yet reaped does not), as a child of ``parent`` if given."""
    fields = stat_fields(pid) if pid is not None else None
    return fields is not None and fields[0] not in EXITED and (parent is None or int(fields[1]) == parent)
