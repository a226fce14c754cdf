"""``make soak``'s answered faults, run one at a time against the fault matrix's server.

The soak injects these among minutes of load and only its report says whether each got its answer;
a change to an attack, or to the front behaviour it guards, would otherwise show only in a soak run.
Here each fault runs as the soak runs it (``python -m soak``: a ``Soak`` around the server, the fault
function called with it) and the test holds it to the soak's own verdict: every ``Check`` the fault
recorded got the answer the fault matrix names (``report.checks``: ``right == injected``), at least
one was recorded (a fault that silently found nothing to attack fails), good traffic alongside never
failed, and the server is live and ready afterwards (``server_survives``). Which answer each check
wants is the fault's own code (``soak.attacks``, ``soak.faults``); the rows it covers:

* ``unanswered``: ``[2^62, 0]`` shapes over HTTP, gRPC and a stream (rows 37–39);
* ``garbage-stream``: a garbage first stream message (row 40);
* ``half-open``: half-open HTTP/2 connections closed by the gRPC front (row 41);
* ``shm-identity``: a hard link to a stub's region, a stub's region renamed over a client's (43, 44);
* ``truncate-race``: a client's region truncated while the front copies through it (row 45);
* ``hang-ups``, ``resets``: inferences hung up once sent over HTTP and calls reset once sent over gRPC,
  from an address of their own (rows 38 and 78), each request so much of the encoder's work that a wave
  still waits in Triton when the next comes: their verdict holds the most of them Triton had waiting at
  once to their share, so a front that freed a hung-up or reset request's slot at once fails it;
* ``shm``, ``bad``, ``overflow`` (``soak.faults``): a stub's own region registered, a wrong dtype, the
  overflowing gRPC shape.

Since the verdicts are the soak's own, a verdict loosened to accept anything would pass the test above
too; so each verdict that can be is also fed a wrong answer: the same fault sent to Triton's own
loopback ports, around the fronts, where inference is refused as restricted (row 22) and a half-open
connection is left open past the soak's 30 s (grpc's own handshake timeout is longer), must record
no right answer. The shared-memory faults cannot be fed one there (Triton's own port refuses their
registration before there is an answer to judge), so the check their registration verdicts share
(``soak.faults.refused``: HTTP 403 or PERMISSION_DENIED, saying why) is fed the fronts' own wrong
answers instead: a registration they accept, and one they refuse for another reason. The renamed
region's check (``soak.attacks.renamed_over``) runs whole, a stub's region renamed, with its request
swapped for real ones that get wrong answers: a region holding a stub's bytes, the same request
through Triton's own port. The truncation race's verdict (``soak.attacks.judge``) is fed real answers
built as the race builds its requests: a region holding another input, the same request through
Triton's own port, and one to a port where nothing listens (the server gone); and the race's "server
kept" is asked about a server the supervisor restarted.

The faults that open a gRPC client of their own (``Soak.clients``: ``shm``, ``shm-identity``,
``truncate-race``) run a few times with the garbage collector off, and must leave none of those
clients open: a soak runs them again and again in one process.

``kill-server`` needs a supervised server of its own (the shared one has no supervisor): the last
test starts one and holds the kill to the soak's verdict on it (an outage of every model, recovered
once the supervisor serves again, and the death counted as the soak's own).

The soak's faults that take a stub down (``kill``, ``stop``) and its embedding update would disturb
the other tests of the shared server, and record outages rather than checks; what they provoke is
held by ``test_resilience_serving``, ``test_hung_stub`` and ``test_live_updates``. The HTTP fuzz
bursts' fuzzer is ``test_http_fuzz``'s.
"""

from __future__ import annotations

import gc
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shared_memory
from harness import PROTOCOLS, trivial_inputs, url
from resilience_fixtures import build_small_repository, explicit_options
from shm_harness import a_stub_region, client_file
from tritonclient.utils import InferenceServerException

from client.connection import connect
from server import TritonServer
from server.ports import free_port
from server.supervisor import RestartPolicy, Supervisor
from soak.attacks import (
    ATTACKS,
    CUT_SHORT,
    HALF_OPEN,
    HALF_OPEN_CLOSED_WITHIN_S,
    ROW,
    ROW_FLOATS,
    RegionRead,
    Verdict,
    from_region,
    into_region,
    judge,
    kill_server,
    race_rights,
    renamed_over,
    server_kept,
)
from soak.faults import FAULTS, Soak, registration_refused
from soak.mixed_load import PIPELINE
from soak.report import SoakReport, own_restarts

pytestmark = pytest.mark.integration
# the faults that record a Check and leave every model serving: what the shared server can take
ANSWERED = {name: ATTACKS[name] for name in ATTACKS if name != "kill-server"} | {
    name: FAULTS[name] for name in ("shm", "bad", "overflow")
}
# the faults that open a gRPC client of their own (``Soak.clients``), and how often a test runs each
OPENING_CLIENTS = ("shm", "shm-identity", "truncate-race")
ROUNDS = 3
WATCHED_S = HALF_OPEN_CLOSED_WITHIN_S + 30  # half-open's checks are recorded from its own thread
# the faults whose verdicts Triton's own ports answer wrongly (the shared-memory ones register a
# region first, which those ports refuse before there is anything to judge)
JUDGING_AN_ANSWER = ("unanswered", "garbage-stream", "bad", "overflow", "half-open", "hang-ups", "resets")


@dataclass
class TritonAlone:
    """What a fault reads of its ``Soak.server``, pointed at Triton's own loopback ports: the fronts'
    checks skipped, inference refused as restricted (row 22)."""

    http_url: str
    grpc_url: str
    pid: int | None
    metrics_url: str


@pytest.fixture()
def new_soak() -> Iterator[Callable[[TritonServer | TritonAlone, list[str], list[str]], Soak]]:
    """What ``python -m soak`` hands each fault, around a server with an empty report; its HTTP client
    closed when the test ends (left to the collector, it closes in whichever thread and warns)."""
    made: list[Soak] = []

    def soak(server: TritonServer | TritonAlone, models: list[str], stub_models: list[str]) -> Soak:
        client = httpclient.InferenceServerClient(server.http_url)
        made.append(Soak(server, client, random.Random(0), SoakReport(duration_s=0.0), models, stub_models))
        return made[-1]

    yield soak
    for each in made:
        each.client.close()


def _run(fault: str, soak: Soak) -> None:
    """The fault, as the soak injects it; half-open's connections are judged from a thread of its own,
    so this waits until every one of them has its verdict (or fails after ``WATCHED_S``)."""
    ANSWERED[fault](soak)
    if fault != "half-open":
        return
    deadline = time.monotonic() + WATCHED_S
    while sum(check.injected for check in soak.report.checks.values()) < HALF_OPEN:
        assert time.monotonic() < deadline, f"half-open judged {soak.report.checks} of {HALF_OPEN}"
        time.sleep(0.2)


@pytest.mark.parametrize("fault", sorted(ANSWERED))
def test_each_answered_fault_gets_its_answer(
    fault_server: TritonServer, good_traffic, new_soak, fault: str
) -> None:
    soak = new_soak(fault_server, ["trivial", "recommender", PIPELINE], [])
    # several faults run trivial themselves: the server's count includes them
    with good_traffic(server_count=False):
        _run(fault, soak)
    checks = {what: (check.right, check.injected) for what, check in soak.report.checks.items()}
    assert checks, f"{fault} recorded no check: it found nothing to attack"
    assert all(right == injected > 0 for right, injected in checks.values()), checks
    assert not soak.report.outages, "an answered fault took a model out of service"


def _grpc_clients() -> list[grpcclient.InferenceServerClient]:
    # type(), not isinstance(): a deprecated proxy among the objects (torch's) warns when asked its class
    return [o for o in gc.get_objects() if issubclass(type(o), grpcclient.InferenceServerClient)]


def _still_open(client: grpcclient.InferenceServerClient) -> bool:
    """Whether a request can still go through ``client`` (a closed one's channel refuses to send it)."""
    try:
        client.is_server_live()
    except ValueError:  # "Cannot invoke RPC on closed channel!"
        return False
    except InferenceServerException:
        pass
    return True


@pytest.mark.parametrize("fault", OPENING_CLIENTS)
def test_a_fault_closes_the_clients_it_opens(fault_server: TritonServer, new_soak, fault: str) -> None:
    """A soak runs each fault again and again in one process: every gRPC client a run opens must be
    closed when it returns. Left to the garbage collector, a caught error's reference cycle keeps it
    open until the next collection, so the collector is off while the fault runs (as between two
    collections), and no client the runs opened may still be open after them. The process's file
    descriptors would not tell: gRPC shares one connection per address among all its channels."""
    soak = new_soak(fault_server, ["trivial", "recommender", PIPELINE], [])
    held_before = _grpc_clients()
    gc.disable()
    try:
        for _ in range(ROUNDS):
            _run(fault, soak)
        opened = [c for c in _grpc_clients() if not any(c is held for held in held_before)]
    finally:
        gc.enable()
    still_open = [client for client in opened if _still_open(client)]
    assert not still_open, f"{len(still_open)} of {fault}'s gRPC clients left open after {ROUNDS} runs"


@pytest.mark.parametrize("fault", JUDGING_AN_ANSWER)
def test_each_verdict_refuses_a_wrong_answer(fault_server: TritonServer, new_soak, fault: str) -> None:
    alone = TritonAlone(
        fault_server.triton_http_url, fault_server.triton_grpc_url, fault_server.pid, fault_server.metrics_url
    )
    soak = new_soak(alone, ["trivial", "recommender", PIPELINE], [])
    _run(fault, soak)
    checks = {what: (check.right, check.injected) for what, check in soak.report.checks.items()}
    assert checks, f"{fault} recorded no check: it found nothing to attack"
    assert all(right == 0 < injected for right, injected in checks.values()), checks


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_registration_verdict_refuses_a_wrong_answer(fault_server: TritonServer, protocol: str) -> None:
    """The verdict of ``shm-identity``'s hard link and ``shm``'s stub region, on answers the fronts give
    to other registrations: a client's own region is accepted (no refusal to credit), and the same name
    registered again is refused as already there (a refusal, but not as forbidden)."""
    client = connect(protocol, url(fault_server, protocol))
    name = f"soak_verdict_{protocol}_{os.getpid()}"
    handle = shared_memory.create_shared_memory_region(name, f"/{name}", 4096)
    try:
        assert not registration_refused(client, protocol, name, "has 2 links"), (
            "an accepted registration counted as refused"
        )
        assert not registration_refused(client, protocol, name), (
            "a refusal for a name already there counted as forbidden"
        )
    finally:
        client.unregister_system_shared_memory(name)
        shared_memory.destroy_shared_memory_region(handle)


class _Regions:
    """A test's clients of ``server`` over ``protocol`` and its regions, each a ``/dev/shm`` file
    registered through the front and open for reading back; all given back when ``stack`` closes."""

    def __init__(self, stack: ExitStack, server: TritonServer, protocol: str) -> None:
        self.stack, self.server, self.protocol = stack, server, protocol
        self.client = self.connect(url(server, protocol))

    def connect(self, at: str) -> Any:
        """A client at ``at``, closed last (here, not in whichever thread collects it: gevent)."""
        client = connect(self.protocol, at)
        self.stack.callback(client.close)
        return client

    def around_the_fronts(self) -> Any:
        """A client of Triton's own loopback port, where inference is refused as restricted (row 22)."""
        own = self.server.triton_http_url if self.protocol == "http" else self.server.triton_grpc_url
        return self.connect(own)

    def nobody(self) -> Any:
        """A client of a port where nothing listens: what a request meets once the server is gone."""
        return self.connect(f"127.0.0.1:{free_port()}")

    def add(self, role: str, data: bytes, size: int = 4096) -> tuple[str, int]:
        """A region of ``size`` bytes starting with ``data``: its name and an O_RDWR descriptor."""
        name = f"soak_verdict_{role}_{self.protocol}_{os.getpid()}"
        path = self.stack.enter_context(client_file(name, size, 0, np.frombuffer(data, np.uint8)))
        descriptor = os.open(path, os.O_RDWR)
        self.stack.callback(os.close, descriptor)
        self.client.register_system_shared_memory(name, f"/{name}", size)
        self.stack.callback(self.client.unregister_system_shared_memory, name)
        return name, descriptor


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_renamed_region_verdict_refuses_a_wrong_answer(fault_server: TritonServer, protocol: str) -> None:
    """``shm-identity``'s stub region renamed over a client's (row 44), run whole as the soak runs it
    (``renamed_over``: a live stub's region renamed over the client's registered one and back), once
    with its own request and once with each of two real requests that get a wrong answer in its
    place: the stub's bytes read (what a front that followed the rename would answer: a copy of the
    stub region's first row, in another region the client registered) and the client's region read
    through Triton's own port (refused there as restricted). Only the first may count as right."""
    stub = a_stub_region(fault_server)
    with stub.open("rb") as stub_file:
        stub_row = stub_file.read(ROW)
    with ExitStack() as stack:
        regions = _Regions(stack, fault_server, protocol)
        stub_bytes, _ = regions.add("stub_bytes", stub_row)
        around = regions.around_the_fronts()
        reads: dict[str, RegionRead] = {
            "its own request": from_region,
            "the stub's bytes read": lambda client, _, __: from_region(client, protocol, stub_bytes),
            "Triton's own port": lambda _, __, name: from_region(around, protocol, name),
        }
        right = {what: renamed_over(regions.client, protocol, stub, read) for what, read in reads.items()}
    assert right == {"its own request": True, "the stub's bytes read": False, "Triton's own port": False}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_truncation_race_verdict_refuses_a_wrong_answer(
    fault_server: TritonServer, protocol: str
) -> None:
    """The verdict of ``truncate-race`` on each request (row 45): answered with ``trivial``'s output
    for the region's input or for the zeros a cut leaves, or refused by the front as cut short. Fed
    real answers of the race's own request (input from the region's start, output into its last row,
    read back): answered from the region, and refused for the file cut to nothing, are right; an
    answer for another input (a region holding other values, judged against the rights of the
    race's values), the same request through Triton's own port (its error, not the front's refusal)
    and a request where nothing listens (the server gone) are wrong."""
    values, size = np.full((1, ROW_FLOATS), 2.5, np.float32), 1 << 16
    with ExitStack() as stack:
        regions = _Regions(stack, fault_server, protocol)
        rights = race_rights(regions.client, protocol, values)
        name, descriptor = regions.add("race", values.tobytes(), size)
        other = regions.add("other_input", (values + 1).tobytes(), size)

        def race_request(client: Any, region: tuple[str, int] = (name, descriptor)) -> Verdict:
            return judge(into_region(client, protocol, *region, size), rights, CUT_SHORT)

        answered = race_request(regions.client)
        wrong = {
            "another input": race_request(regions.client, other),
            "Triton's own port": race_request(regions.around_the_fronts()),
            "the server gone": race_request(regions.nobody()),
        }
        os.ftruncate(descriptor, 0)
        cut = race_request(regions.client)
    assert (answered, cut) == (Verdict(answered=True), Verdict(refused=True)), (answered, cut)
    judged_right = {what: v for what, v in wrong.items() if v.answered or v.refused or not v.wrong}
    assert not judged_right, judged_right


def _serves(server: TritonServer) -> bool:
    for protocol in PROTOCOLS:
        connect(protocol, url(server, protocol)).infer("trivial", trivial_inputs(protocol))
    return True


def test_the_soaks_kill_of_tritonserver_is_its_own_and_recovered(
    spec_data: dict[str, Any], tmp_path: Path, new_soak
) -> None:
    """``kill-server`` as ``python -m soak`` runs it: a supervised server with both fronts is killed with
    ``kill -9``; the fault waits until the supervisor serves again. Every model's outage then ends
    (the soak fails a run with an outage never recovered), the death is the soak's own (not a
    restart it would fail), the restarted server is not the one ``truncate-race`` would count as
    kept, and it answers through the same fronts (row 46)."""
    repository = build_small_repository(spec_data, tmp_path / "repository", pipeline=False)
    options = explicit_options(repository, tmp_path / "server")
    options.http_front = options.grpc_front = True
    server = TritonServer(options)
    supervisor = Supervisor(server, None, RestartPolicy(first_delay_s=0.5))
    supervisor.start()
    supervising = threading.Thread(target=supervisor.run, daemon=True)
    supervising.start()
    try:
        soak = new_soak(server, ["trivial"], [])
        soak.supervisor = supervisor
        killed, fronts = server.pid, [front.pid for front in server.fronts]
        stubs = soak.stub_pids()
        assert server_kept(soak, killed, stubs), "the server counted as lost before the kill"
        kill_server(soak)
        assert not server_kept(soak, killed, stubs), "a restarted server counted as kept"
        report = soak.report
        assert report.server_kills == [killed]
        assert [o.model for o in report.outages] == ["trivial"]
        assert all(o.recovered_at is not None for o in report.outages), "not serving again after the kill"
        own_restarts(report, supervisor.record.history)
        assert report.server_restarts == [], report.server_restarts
        assert server.pid != killed and [front.pid for front in server.running_fronts] == fronts
        assert _serves(server)
    finally:
        supervisor.release()
        supervising.join(timeout=120)
        server.stop()
