"""The invariant fuzz's shared-memory regions and invariant (b) over them. Client A is the fuzz, client B
another uid (``soak.other_uid``, as root); each fills its files with its canary and registers them on
both fronts. ``verify`` flags any byte changed but an answered output's, and any canary out of place."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tritonclient.grpc import service_pb2

from soak.fuzz_wire import Answer, Client, Placed, grpc_answer, http_answer
from soak.other_uid import OtherUser
from soak.raw_http import Request
from soak.request_space import PAGE, REGION_BYTES, Registration, ShmRange

SHM = Path("/dev/shm")
# where each of A's regions starts in its file: a1 is registered one page in (Triton 2.51 applied that
# offset twice: fault matrix row 49)
A_OFFSETS = {"a0": 0, "a1": PAGE, "shared": 0}
THEIRS_BYTES = 16 * PAGE
FRONTS = ("http", "grpc")  # each keeps its own table of regions


def canary(client: str, tag: str) -> bytes:
    """Sixteen bytes no model output or fuzz input holds by chance, naming ``client``."""
    return f"\xa5{client}-canary-{tag}"[:15].ljust(15, "#").encode("latin-1") + b"\x5a"


def filled(mark: bytes, size: int) -> bytes:
    return (mark * (size // len(mark) + 1))[:size]


def shm_call(
    who: Client | OtherUser, protocol: str, what: str, call: str, name: str = "", fields: dict | None = None
) -> Answer:
    """One system shared-memory API ``call`` (``Register``, ``Unregister``, ``Status``) as ``who``."""
    fields = fields or {}
    if protocol == "grpc":
        request = getattr(service_pb2, f"SystemSharedMemory{call}Request")(name=name, **fields)
        return grpc_answer(what, *who.grpc(f"SystemSharedMemory{call}", request.SerializeToString(), 30))
    if not name:  # the status of every region
        return http_answer(what, who.http(Request("GET", "/v2/systemsharedmemory/status", []), 30))
    path = f"/v2/systemsharedmemory/region/{name}/{call.lower()}"
    headers = [("Content-Type", "application/json")] if fields else []
    body = json.dumps(fields).encode() if fields else b""
    return http_answer(what, who.http(Request("POST", path, headers, body), 30))


@dataclass
class ClientFile:
    """A client's ``/dev/shm`` file, what it must hold, and the ranges outputs may have changed."""

    path: Path
    owner: str
    expected: bytearray
    allowed: list[tuple[int, int]] = field(default_factory=list)

    def write(self, position: int, data: bytes) -> bool:
        """Write ``data`` at ``position`` if it fits (the fuzz's own input bytes), and expect it there."""
        if position < 0 or position + len(data) > len(self.expected):
            return False
        with open(self.path, "r+b") as handle:
            handle.seek(position)
            handle.write(data)
        self.expected[position : position + len(data)] = data
        return True

    def changed_outside(self, actual: bytes) -> list[tuple[int, int]]:
        """The byte ranges of ``actual`` that differ from what is expected, outside ``allowed``."""
        if actual == self.expected:
            return []
        if len(actual) != len(self.expected):
            return [(min(len(actual), len(self.expected)), max(len(actual), len(self.expected)))]
        differs = np.frombuffer(actual, np.uint8) != np.frombuffer(self.expected, np.uint8)
        for start, end in self.allowed:
            differs[max(start, 0) : max(end, 0)] = False
        edges = np.flatnonzero(np.diff(np.concatenate([[0], differs.view(np.int8), [0]])))
        return [(int(start), int(end)) for start, end in zip(edges[::2], edges[1::2], strict=True)]


class Regions:
    """Both clients' regions on both fronts; ``tag`` keeps this run's names apart."""

    def __init__(self, client: Client, other: OtherUser | None, tag: str, stub_region: str) -> None:
        self.client, self.other, self.tag, self.stub_region = client, other, tag, stub_region
        self.marks = {"a": canary("A", tag), "b": canary("B", tag)}
        self.files: dict[str, ClientFile] = {}  # A's by region kind (the case's own: "fresh"); B's "b_<kind>"
        self.starts = dict(A_OFFSETS)  # where each of A's regions starts in its file
        self.setup_answers: list[Answer] = []

    def name(self, kind: str) -> str:
        return f"{self.tag}_{kind}"

    def setup(self) -> None:
        """B's files first, then A's; each registered on both fronts."""
        if self.other is not None:
            for kind, size in (("theirs", THEIRS_BYTES), ("shared", REGION_BYTES["shared"])):
                path = SHM / f"{self.tag}_b_{kind}"
                self.other.create(path.name, filled(self.marks["b"], size))
                self.files[f"b_{kind}"] = ClientFile(path, "b", bytearray(filled(self.marks["b"], size)))
                name = self.name(kind)
                self.setup_answers += [self.register(p, name, path.name, 0, size, self.other) for p in FRONTS]
        for kind, offset in A_OFFSETS.items():
            path = SHM / f"{self.tag}_a_{kind}"
            self.files[kind] = self._create(path, offset + REGION_BYTES[kind])
            size = REGION_BYTES[kind]
            self.setup_answers += [self.register(p, self.name(kind), path.name, offset, size) for p in FRONTS]

    def _create(self, path: Path, size: int) -> ClientFile:
        data = filled(self.marks["a"], size)
        path.write_bytes(data)
        return ClientFile(path, "a", bytearray(data))

    def register(
        self, protocol: str, name: str, file_name: str, offset: int, size: int, other: OtherUser | None = None
    ) -> Answer:
        """Register ``/dev/shm/file_name`` as ``name`` on one front, as A (or as B: ``other``)."""
        who, what = (self.client, "register") if other is None else (other, "register (other uid)")
        fields = {"key": f"/{file_name}", "offset": offset, "byte_size": size}
        return shm_call(who, protocol, what, "Register", name, fields)

    def register_fresh(self, protocol: str, registration: Registration, number: int) -> Answer:
        """The case's own registration under the name of kind ``fresh``."""
        key = registration.key
        if key == "own":
            path = SHM / f"{self.tag}_a_fresh{number}"
            self.files["fresh"] = self._create(path, registration.file_size)
            self.starts["fresh"] = registration.offset
            file_name = path.name
        else:
            file_name = {
                "theirs": f"{self.tag}_b_theirs",
                "stub": self.stub_region,
                "missing": f"{self.tag}_missing",
            }[key]
        return self.register(
            protocol, self.name("fresh"), file_name, registration.offset, registration.byte_size
        )

    def end_fresh(self, protocol: str) -> list[Answer]:
        """Unregister the case's own region and remove its file (after ``verify``)."""
        answer = shm_call(self.client, protocol, "unregister", "Unregister", self.name("fresh"))
        fresh = self.files.pop("fresh", None)
        if fresh is not None:
            fresh.path.unlink(missing_ok=True)
        return [answer]

    def place(self, shm: ShmRange, size: int, data: bytes | None = None) -> Placed:
        """A range as sent, with ``data`` written there first when it lies in A's file."""
        placed = Placed(self.name(shm.region), shm.offset, size if shm.size is None else shm.size)
        target, start = self.files.get(shm.region), self.starts.get(shm.region, 0)
        if data is not None and target is not None:
            target.write(start + shm.offset, data)
        return placed

    def allow_output(self, shm: ShmRange, size: int) -> None:
        """The range an output was written into may change (only for a request answered ok)."""
        target, start = self.files.get(shm.region), self.starts.get(shm.region, 0)
        if target is not None and size > 0:
            target.allowed.append((start + shm.offset, start + shm.offset + size))

    def verify(self, answers: Iterable[tuple[str, Answer]]) -> list[str]:
        """Invariant (b) over every file and the ``(client, answer)`` pairs. A file changed where it must
        not is written back, so hypothesis's replay of the case meets the same bytes."""
        problems = []
        for client, answer in answers:
            for other, mark in self.marks.items():
                if other != client and mark in answer.payload:
                    problems.append(f"the answer to {answer.what} holds another client's canary {mark!r}")
        for client_file in self.files.values():
            actual = client_file.path.read_bytes()
            changed = client_file.changed_outside(actual)
            foreign = self.marks["b" if client_file.owner == "a" else "a"]
            for start, end in client_file.allowed:
                if foreign in actual[max(start - 15, 0) : end + 15]:
                    problems.append(f"{client_file.path.name} got another client's canary in an output range")
                end = min(end, len(actual), len(client_file.expected))
                client_file.expected[start:end] = actual[start:end]
            client_file.allowed.clear()
            if changed:
                where = ", ".join(f"[{start}, {end})" for start, end in changed[:4])
                problems.append(
                    f"{client_file.path.name} ({client_file.owner}'s) changed outside the outputs: {where}"
                )
                client_file.path.write_bytes(client_file.expected)  # back as it was: a replay sees it again
        return problems

    def close(self) -> None:
        for protocol in FRONTS:
            for kind in A_OFFSETS:
                shm_call(self.client, protocol, "unregister", "Unregister", self.name(kind))
        for client_file in self.files.values():
            client_file.path.unlink(missing_ok=True)
