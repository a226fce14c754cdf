"""The fronts' own table of the system shared-memory regions clients register, so Triton never maps a
client's file: Triton 2.51 applies a region's offset twice (DESIGN.md §3; fault matrix rows 24, 43–45
and 49–52; docs/SERVING.md, "Shared memory"). A registration keeps a descriptor of one file the
client owns, checked on that descriptor; copies use ``pread``/``pwrite`` on it, on the event loop.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from server.fronts.client_connections import raise_open_file_limit
from server.fronts.refusal import Refusal, RequestRefusedError

SHM_DIR = Path("/dev/shm")
# What a key may name: one file directly in /dev/shm, as shm_open takes it ("/name" or "name").
KEY = re.compile(r"/?([A-Za-z0-9._-]{1,255})")
MAX_PER_CLIENT = 256
MAX_REGIONS = 2048
SOCKET_ROOM = 4096  # descriptors a full region table leaves the front for its sockets
FileId = tuple[int, int]  # (st_dev, st_ino): which file, whatever name reaches it
_server_files: dict[FileId, str] = {}  # every server region this process has seen: file -> its name
_REMEMBERED = 4096


@dataclass(frozen=True)
class Client:
    """Who sends a request: its socket's uid (None: not on this host), and the admin key or not."""

    uid: int | None
    admin: bool = False


@dataclass(frozen=True)
class RegionUse:
    """A shared-memory range an input or output of an inference request names."""

    region: object
    offset: int
    byte_size: int


@dataclass(frozen=True)
class ServerRegions:
    """The server's own regions, remembered by device and inode: a rename or hard link is known."""

    prefix: str
    stub_regions: Callable[[], set[str]] = set
    directory: Path = SHM_DIR

    def remember(self) -> dict[FileId, str]:
        names = set(self.stub_regions())
        if self.prefix:
            names |= {path.name for path in self.directory.glob(f"{self.prefix}*")}
        for name in names:
            try:
                info = os.lstat(self.directory / name)
            except OSError:
                continue
            _server_files[(info.st_dev, info.st_ino)] = name
        while len(_server_files) > _REMEMBERED:  # oldest first (dicts keep insertion order)
            del _server_files[next(iter(_server_files))]
        return _server_files

    def which(self, name: str, info: os.stat_result) -> str | None:
        """The server region the file ``name`` (with ``info``) is, by name or by file; None if none."""
        if (self.prefix and name.startswith(self.prefix)) or name in self.stub_regions():
            return name
        return self.remember().get((info.st_dev, info.st_ino))


def _forbidden(message: str) -> RequestRefusedError:
    return RequestRefusedError(message, Refusal.FORBIDDEN)


def check_copy_size(uses: Iterable[RegionUse], limit: int) -> None:
    """One request's shared-memory inputs are copied into the front's memory: bounded as a body is."""
    total = sum(use.byte_size for use in uses)
    if total > limit:
        raise RequestRefusedError(
            f"the shared-memory inputs of this request hold {total} bytes; the front copies at most "
            f"{limit} bytes a request, as it takes at most that in a request body",
            Refusal.TOO_LARGE,
        )


def client_uid(client: Client, name: str) -> int:
    """The client's uid: system shared memory is for clients on this host (403 for others)."""
    if client.uid is None:
        raise _forbidden(
            f"shared memory region '{name}': system shared memory needs a client on this host (the "
            "connection's owner could not be found)"
        )
    return client.uid


def open_client_file(
    server: ServerRegions, client: Client, name: str, key: object, offset: int, byte_size: int
) -> int:
    """A descriptor of the file ``key`` names, checked on the open descriptor (what is kept)."""
    uid = client_uid(client, name)
    match = KEY.fullmatch(key) if isinstance(key, str) else None
    if match is None or match[1] in (".", ".."):
        raise RequestRefusedError(
            f"shared memory region '{name}': key {key!r} must name one file in /dev/shm "
            "('/name': 1-255 characters of A-Z a-z 0-9 . _ -)"
        )
    file_name = match[1]
    path, where = server.directory / file_name, f"shared memory region '{name}': /dev/shm/{file_name}"
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise _forbidden(f"{where} is a symbolic link") from error
        kind = Refusal.FORBIDDEN if error.errno == errno.EACCES else Refusal.INVALID
        raise RequestRefusedError(
            f"Unable to open shared memory region: '{key}' ({error.strerror})", kind
        ) from error
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise _forbidden(f"{where} is not a regular file")
        if info.st_nlink != 1:
            raise _forbidden(
                f"{where} has {info.st_nlink} links (a hard link names another file); register a file "
                "with one name"
            )
        own = server.which(file_name, info)
        if own is not None:
            raise _forbidden(f"{where} is the server's own IPC region '{own}'")
        if info.st_uid != uid:
            raise _forbidden(
                f"{where} belongs to uid {info.st_uid}, not to this client (uid {uid}); register regions "
                "your own process created"
            )
        if offset + byte_size > info.st_size:
            raise RequestRefusedError(
                f"{where}: offset + byte size {offset + byte_size} exceeds the file's {info.st_size} bytes"
            )
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


@dataclass(frozen=True)
class Region:
    """One registration: what the client asked for, and the descriptor of the file it named then."""

    name: str
    key: str
    offset: int
    byte_size: int
    descriptor: int

    def status(self) -> dict[str, object]:
        """As Triton lists a region (``/v2/systemsharedmemory/status``)."""
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


class RegionTable:
    """The regions clients registered, by uid and name; every copy to or from a client's memory."""

    def __init__(
        self, server: ServerRegions, max_per_client: int = MAX_PER_CLIENT, max_regions: int = MAX_REGIONS
    ) -> None:
        self.server, self.max_per_client, self.max_regions = server, max_per_client, max_regions
        self._regions: dict[int, dict[str, Region]] = {}
        raise_open_file_limit(max_regions + SOCKET_ROOM)

    def register(self, client: Client, name: str, key: object, offset: int, byte_size: int) -> None:
        uid = client_uid(client, name)
        if not isinstance(name, str) or not name or any(ord(c) < 0x20 for c in name):
            raise RequestRefusedError(f"shared memory region name {name!r} must be a printable string")
        own = self._regions.get(uid, {})
        if name in own:
            raise RequestRefusedError(
                f"shared memory region '{name}' already in manager", Refusal.ALREADY_EXISTS
            )
        if len(own) >= self.max_per_client or self.count() >= self.max_regions:
            raise RequestRefusedError(
                f"shared memory region '{name}': this client has {len(own)} regions registered (at most "
                f"{self.max_per_client}, {self.max_regions} for all clients); unregister some first",
                Refusal.TOO_MANY,
                "shared-memory regions beyond its share (429 / RESOURCE_EXHAUSTED)",
            )
        descriptor = open_client_file(self.server, client, name, key, offset, byte_size)
        self._regions.setdefault(uid, {})[name] = Region(name, str(key), offset, byte_size, descriptor)

    def unregister(self, client: Client, name: str | None) -> None:
        """Unregister the client's region ``name``, or all of its regions when ``name`` is empty."""
        uid = client_uid(client, name or "")
        own = self._regions.get(uid, {})
        for region in [own.pop(name, None)] if name else [own.pop(n) for n in list(own)]:
            if region is not None:
                os.close(region.descriptor)
        if not own:
            self._regions.pop(uid, None)

    def status(self, client: Client, name: str | None = None) -> list[Region]:
        """The client's regions (only ``name`` if given: Triton's 404 if it has none of that name)."""
        own = self._regions.get(client_uid(client, name or ""), {})
        if not name:
            return list(own.values())
        if name not in own:
            raise RequestRefusedError(
                f"Unable to find system shared memory region: '{name}'", Refusal.NOT_FOUND
            )
        return [own[name]]

    def count(self) -> int:
        return sum(len(own) for own in self._regions.values())

    def check(self, client: Client, use: RegionUse) -> tuple[Region, int]:
        """The client's region ``use`` names and the file offset it starts at (Triton's 404 / 400)."""
        name = use.region if isinstance(use.region, str) else repr(use.region)
        region = self._regions.get(client_uid(client, name), {}).get(name)
        if region is None:
            raise RequestRefusedError(f"Unable to find shared memory region: '{name}'", Refusal.NOT_FOUND)
        if use.offset < 0 or use.byte_size < 0 or use.offset + use.byte_size > region.byte_size:
            raise RequestRefusedError(f"Invalid offset + byte size for shared memory region: '{name}'")
        return region, region.offset + use.offset

    def copies(self, client: Client, use: RegionUse | None) -> RegionUse | None:
        """``use`` if the front copies it (a region not registered here is the operator's: CUDA)."""
        operators = use is not None and client.admin and use.region not in self._regions.get(client.uid, {})
        return None if operators else use

    def read(self, client: Client, use: RegionUse) -> bytes:
        """The ``use.byte_size`` bytes at ``use.offset`` of the client's region."""
        region, start = self.check(client, use)
        data = os.pread(region.descriptor, use.byte_size, start)
        if len(data) != use.byte_size:
            raise RequestRefusedError(
                f"shared memory region '{region.name}': its file holds {os.fstat(region.descriptor).st_size} "
                f"bytes, fewer than the {start + use.byte_size} this input needs (it was cut short after "
                "registration)"
            )
        return data

    def write(self, client: Client, use: RegionUse, data: bytes) -> None:
        """``data`` into the client's region at ``use.offset`` (the caller checked the size)."""
        region, start = self.check(client, use)
        view = memoryview(data)
        while view:
            written = os.pwrite(region.descriptor, view, start)
            view, start = view[written:], start + written

    def close(self) -> None:
        for own in self._regions.values():
            for region in own.values():
                os.close(region.descriptor)
        self._regions.clear()


@dataclass
class FrontRegions:
    """A front's system shared memory: its own table, or (``trusted``) Triton's mapping."""

    server: ServerRegions
    max_request_bytes: int  # what one request may copy in: the front's bound on a body or message
    trusted: bool = False

    def __post_init__(self) -> None:
        self.table: RegionTable | None = None if self.trusted else RegionTable(self.server)

    @property
    def descriptors(self) -> int:
        """The most descriptors the front's table may hold open (none when trusted: Triton maps)."""
        return 0 if self.table is None else self.table.max_regions

    def serve(
        self, action: str, client: Callable[[], Client], name: str, registered: Callable[[], tuple]
    ) -> list[Region] | None:
        """A system shared-memory call (``register``: ``registered()`` gives key, offset and byte size),
        answered from the front's table: the regions a status lists, else []; None: trusted, forward it."""
        if action == "register":
            if self.table is None:
                os.close(open_client_file(self.server, client(), name, *registered()))
                return None
            self.table.register(client(), name, *registered())
            return []
        if self.table is None:
            return None
        if action == "unregister":
            self.table.unregister(client(), name)
            return []
        return self.table.status(client(), name)

    @staticmethod
    def check_cuda(client: Client) -> None:
        """CUDA IPC handles cannot be attributed to a client: the operator's alone (the admin key)."""
        if not client.admin:
            raise _forbidden("CUDA shared memory through this server's front needs the admin key")
