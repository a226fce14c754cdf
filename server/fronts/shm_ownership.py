"""Which system shared-memory regions a client may name: only regions it owns.

Triton 2.51 maps any ``/dev/shm`` file a client names, with the server's rights: a client could
register a Python-backend stub's own IPC region (named in the stub's command line), read other
clients' request tensors through it, and crash the server by having an output written into it. The
fronts therefore check every request that names a region (register, unregister, and each input or
output that travels in one) against these rules:

* **One name, one file.** A region's registered name must be its key without the leading ``/``
  (``register_system_shared_memory("r1", "/r1", ...)``, as ``client.shm`` does), so every later
  request that names the region also names its file, and the check needs no registry of its own.
* **Owned means the file's owner is the connected client's uid** (``server.fronts.peer``): on one host the
  kernel's uid is the boundary between users, a file a client created is owned by it, and Triton,
  which runs as the server's user, must not be its confused deputy. A process of the server's own uid
  can read ``/dev/shm`` and the server's memory directly anyway; for it the rules still refuse the
  stubs' regions, so a mistake cannot corrupt the server's IPC.
* **Never a stub's region**: no name of a live Python-backend stub on this host, nor the server's
  own region prefix, nor a file that *is* one of the server's regions under another name (its device
  and inode: a hard link or a rename; fault matrix row 43).
* **One name per file**: a file with more than one link is refused. A hard link to another file
  carries that file's owner but the link's name; Triton maps whatever the name reaches (measured:
  an output written through a hard link to a stub's region, and the server died of SIGSEGV).
* **Within the file**: ``offset + byte_size`` must fit the file's current size, at registration and
  on every use (a mapping past the end of a file is a SIGBUS in the server).
* **The file the server mapped**: a client that dies without unregistering leaves its region mapped
  under its name after the file is gone; a new file of that name (another user's) must not become a
  window onto the old memory, and a file swapped in under the name between the front's check and
  Triton's open must not be used either. So a use is refused unless everything the server maps
  under the name is the very file (device and inode, from ``/proc/<server>/maps``) that passes the
  rules above now. Registering alone maps but neither reads nor writes; every use is checked, which
  is where the rules hold (fault matrix rows 43 and 44).

Holders of the admin key (the operator) skip the ownership rules, and only they may unregister every
region at once or use the CUDA shared-memory API, whose IPC handles the fronts cannot attribute.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from server.fronts.refusal import Refusal, RequestRefusedError

SHM_DIR = Path("/dev/shm")
NAME = re.compile(r"[A-Za-z0-9._-]{1,200}")  # what a /dev/shm name may be here: one file, no escapes


@dataclass(frozen=True)
class Client:
    """Who sends a request: the uid of its socket (None: not on this host) and whether it holds the
    admin key."""

    uid: int | None
    admin: bool = False


@dataclass(frozen=True)
class RegionUse:
    """A shared-memory range an input or output of an inference request names."""

    region: object
    offset: int
    byte_size: int


@dataclass(frozen=True)
class RegionRules:
    """The server's own region prefix and where to learn the stubs' regions (``server.stubs``)."""

    server_prefix: str  # "": none known
    stub_regions: Callable[[], set[str]]
    # whose mappings tell which file a registered name stands for; a callable follows a server that
    # the supervisor restarts (server.fronts.process)
    server_pid: int | Callable[[], int | None] | None = None
    directory: Path = SHM_DIR

    def current_server_pid(self) -> int | None:
        return self.server_pid() if callable(self.server_pid) else self.server_pid


FileId = tuple[int, int]  # (st_dev, st_ino): which file, whatever name reaches it
_server_files: dict[FileId, str] = {}  # every server region seen by this process: file -> its name
_REMEMBERED = 4096


def _file_id(info: os.stat_result) -> FileId:
    return (info.st_dev, info.st_ino)


def remember_server_regions(rules: RegionRules) -> dict[FileId, str]:
    """The server's own regions (its prefix, the live stubs' names) as files, remembered once seen, so
    that a region renamed or hard-linked to another name is still known by its device and inode.
    The fronts call this every second as well as on each check."""
    names = set(rules.stub_regions())
    if rules.server_prefix:
        names |= {path.name for path in rules.directory.glob(f"{rules.server_prefix}*")}
    for name in names:
        try:
            _server_files[_file_id(os.lstat(rules.directory / name))] = name
        except OSError:
            continue
    while len(_server_files) > _REMEMBERED:  # oldest first (dicts keep insertion order)
        del _server_files[next(iter(_server_files))]
    return _server_files


def _forbidden(message: str) -> RequestRefusedError:
    return RequestRefusedError(message, Refusal.FORBIDDEN)


def _region_file(rules: RegionRules, name: str) -> os.stat_result | None:
    try:
        return os.lstat(rules.directory / name)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise _forbidden(
            f"shared memory region '{name}': cannot inspect its file ({error.strerror})"
        ) from error


def _mapped_files(rules: RegionRules, name: str) -> set[FileId]:
    """Device and inode of every file the server maps as ``/dev/shm/<name>`` (deleted ones included).
    ``/proc/<pid>/maps`` names a mapping by the path it was opened through, its device as hex
    ``major:minor``."""
    pid = rules.current_server_pid()
    if pid is None:
        return set()
    try:
        lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    except OSError:
        return set()
    path = str(rules.directory / name)
    files = set()
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].removesuffix(" (deleted)") == path:
            major, minor = (int(part, 16) for part in fields[3].split(":"))
            files.add((os.makedev(major, minor), int(fields[4])))
    return files


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise RequestRefusedError(
            f"shared memory region name {name!r} must be 1-200 characters of A-Z a-z 0-9 . _ -"
        )
    return name


def _check_one_file(rules: RegionRules, name: str, info: os.stat_result) -> None:
    """The file has one name, and it is none of the server's regions under another name (a write there
    kills the server)."""
    if info.st_nlink != 1:
        raise _forbidden(
            f"shared memory region '{name}': /dev/shm/{name} has {info.st_nlink} links (a hard link "
            "names another file); register a file with one name"
        )
    server_files = remember_server_regions(rules)
    if _file_id(info) in server_files:
        raise _forbidden(
            f"shared memory region '{name}': /dev/shm/{name} is the server's own IPC region "
            f"'{server_files[_file_id(info)]}' under another name"
        )


def _check_owned(rules: RegionRules, client: Client, name: str, end: int | None) -> None:
    """The file ``name`` exists, is a regular file and (unless the client holds the admin key) is owned
    by the client and is no stub's region by name. Unless ``end`` is None (an unregister, which only
    unmaps): it has one link, is none of the server's regions under another name, and holds at least
    ``end`` bytes."""
    info = _region_file(rules, name)
    if info is None:
        raise RequestRefusedError(f"shared memory region '{name}': /dev/shm/{name} does not exist")
    if not stat.S_ISREG(info.st_mode):
        raise _forbidden(f"shared memory region '{name}': /dev/shm/{name} is not a regular file")
    if not client.admin:
        if client.uid is None:
            raise _forbidden(
                f"shared memory region '{name}': system shared memory needs a client on this host "
                "(the connection's owner could not be found)"
            )
        if info.st_uid != client.uid:
            raise _forbidden(
                f"shared memory region '{name}': /dev/shm/{name} belongs to uid {info.st_uid}, not to "
                f"this client (uid {client.uid}); register regions your own process created"
            )
        if (rules.server_prefix and name.startswith(rules.server_prefix)) or name in rules.stub_regions():
            raise _forbidden(f"shared memory region '{name}' is the server's own IPC region")
    if end is None:
        return
    if not client.admin:
        _check_one_file(rules, name, info)
    if end > info.st_size:
        raise RequestRefusedError(
            f"shared memory region '{name}': offset + byte size {end} exceeds the file's {info.st_size} bytes"
        )


def check_register(
    rules: RegionRules, client: Client, name: str, key: object, offset: int, size: int
) -> None:
    """A system shared-memory register request (``RequestRefusedError`` unless allowed)."""
    _check_name(name)
    if key != f"/{name}":
        raise RequestRefusedError(
            f"shared memory region '{name}': key must be '/{name}' (the region's name is its file's "
            f"name, so each request naming it can be checked), got {key!r}"
        )
    _check_owned(rules, client, name, offset + size)


def check_use(rules: RegionRules, client: Client, name: object, offset: int, size: int) -> None:
    """An input or output that travels in region ``name`` at ``offset`` (``size`` bytes)."""
    name = _check_name(name)
    _check_owned(rules, client, name, offset + size)
    mapped = _mapped_files(rules, name)
    info = _region_file(rules, name)
    if mapped and (info is None or mapped != {_file_id(info)}):
        raise _forbidden(
            f"shared memory region '{name}' is registered for a file that no longer exists; "
            "unregister it and register your own"
        )


def check_uses(rules: RegionRules, client: Client, uses: list[RegionUse]) -> None:
    """Every shared-memory range an inference request names."""
    for use in uses:
        check_use(rules, client, use.region, use.offset, use.byte_size)


def check_unregister(rules: RegionRules, client: Client, name: str | None) -> None:
    """Unregister one region (the owner's, or one whose file is gone), or all of them (admin only)."""
    if not name:
        if not client.admin:
            raise _forbidden("unregistering every shared memory region needs the admin key; name yours")
        return
    _check_name(name)
    if client.admin or _region_file(rules, name) is None:
        return
    _check_owned(rules, client, name, None)


def check_cuda(client: Client) -> None:
    """CUDA shared memory carries IPC handles the fronts cannot attribute to a client."""
    if not client.admin:
        raise _forbidden("CUDA shared memory through this server's front needs the admin key")
