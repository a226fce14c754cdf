"""``make soak``'s answered faults, run one at a time against the fault matrix's server.

The soak injects these among minutes of load and only its report says whether each got its answer;
a change to an attack, or to the front behaviour it guards, would otherwise show only in a soak run.
Here each fault runs as the soak runs it (``soak.run``: a ``Soak`` around the server, the fault
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
* ``shm``, ``bad``, ``overflow`` (``soak.faults``): a stub's own region registered, a wrong dtype, the
  overflowing gRPC shape.

Since the verdicts are the soak's own, a verdict loosened to accept anything would pass the test above
too; so each verdict that can be is also fed a wrong answer: the same fault sent to Triton's own
loopback ports, around the fronts, where inference is refused as restricted (row 22) and a half-open
connection is left open past the soak's 30 s (grpc's own handshake timeout is longer), must record
no right answer. The shared-memory faults cannot be fed one there (Triton's own port refuses their
registration before there is an answer to judge), so the check their registration verdicts share
(``soak.faults.refused``: HTTP 403 or PERMISSION_DENIED, saying why) is fed the fronts' own wrong
answers instead: a registration they accept, and one they refuse for another reason.

``kill-server`` needs a supervised server of its own (the shared one has no supervisor): the last
test starts one and holds the kill to the soak's verdict on it (an outage of every model, recovered
once the supervisor serves again, and the death counted as the soak's own).

The soak's faults that take a stub down (``kill``, ``stop``) and its embedding update would disturb
the other tests of the shared server, and record outages rather than checks; what they provoke is
held by ``test_resilience_serving``, ``test_hung_stub`` and ``test_live_updates``. The HTTP fuzz
bursts' fuzzer is ``test_http_fuzz``'s.
"""

from __future__ import annotations

import functools
import os
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shared_memory
from harness import PROTOCOLS, trivial_inputs, url
from resilience_fixtures import build_small_repository, explicit_options

from client.connection import connect
from server import TritonServer
from server.supervisor import RestartPolicy, Supervisor
from soak.attacks import ATTACKS, HALF_OPEN, HALF_OPEN_CLOSED_WITHIN_S, kill_server
from soak.faults import FAULTS, Soak, refused
from soak.mixed_load import PIPELINE
from soak.report import SoakReport, own_restarts

pytestmark = pytest.mark.integration
# the faults that record a Check and leave every model serving: what the shared server can take
ANSWERED = {name: ATTACKS[name] for name in ATTACKS if name != "kill-server"} | {
    name: FAULTS[name] for name in ("shm", "bad", "overflow")
}
WATCHED_S = HALF_OPEN_CLOSED_WITHIN_S + 30  # half-open's checks are recorded from its own thread
# the faults whose verdicts Triton's own ports answer wrongly (the shared-memory ones register a
# region first, which those ports refuse before there is anything to judge)
JUDGING_AN_ANSWER = ("unanswered", "garbage-stream", "bad", "overflow", "half-open")


@dataclass
class TritonAlone:
    """What a fault reads of its ``Soak.server``, pointed at Triton's own loopback ports: the fronts'
    checks skipped, inference refused as restricted (row 22)."""

    http_url: str
    grpc_url: str
    pid: int | None


def _soak(server: TritonServer | TritonAlone, models: list[str], stub_models: list[str]) -> Soak:
    """What ``soak.run`` hands each fault, around ``server`` with an empty report."""
    client = httpclient.InferenceServerClient(server.http_url)
    return Soak(server, client, random.Random(0), SoakReport(duration_s=0.0), models, stub_models)


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
def test_each_answered_fault_gets_its_answer(fault_server: TritonServer, good_traffic, fault: str) -> None:
    soak = _soak(fault_server, ["trivial", "recommender", PIPELINE], [])
    # several faults run trivial themselves: the server's count includes them
    with good_traffic(server_count=False):
        _run(fault, soak)
    checks = {what: (check.right, check.injected) for what, check in soak.report.checks.items()}
    assert checks, f"{fault} recorded no check: it found nothing to attack"
    assert all(right == injected > 0 for right, injected in checks.values()), checks
    assert not soak.report.outages, "an answered fault took a model out of service"


@pytest.mark.parametrize("fault", JUDGING_AN_ANSWER)
def test_each_verdict_refuses_a_wrong_answer(fault_server: TritonServer, fault: str) -> None:
    alone = TritonAlone(fault_server.triton_http_url, fault_server.triton_grpc_url, fault_server.pid)
    soak = _soak(alone, ["trivial", "recommender", PIPELINE], [])
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
    register = functools.partial(client.register_system_shared_memory, name, f"/{name}", 4096)
    try:
        assert not refused(register, protocol, "has 2 links"), "an accepted registration counted as refused"
        assert not refused(register, protocol), "a refusal for a name already there counted as forbidden"
    finally:
        client.unregister_system_shared_memory(name)
        shared_memory.destroy_shared_memory_region(handle)


def _serves(server: TritonServer) -> bool:
    for protocol in PROTOCOLS:
        connect(protocol, url(server, protocol)).infer("trivial", trivial_inputs(protocol))
    return True


def test_the_soaks_kill_of_tritonserver_is_its_own_and_recovered(
    spec_data: dict[str, Any], tmp_path: Path
) -> None:
    """``kill-server`` as ``soak.run`` runs it: a supervised server with both fronts is killed with
    ``kill -9``; the fault waits until the supervisor serves again. Every model's outage then ends
    (the soak fails a run with an outage never recovered), the death is the soak's own (not a
    restart it would fail), and the restarted server answers through the same fronts (row 46)."""
    repository = build_small_repository(spec_data, tmp_path / "repository", pipeline=False)
    options = explicit_options(repository, tmp_path / "server")
    options.http_front = options.grpc_front = True
    server = TritonServer(options)
    supervisor = Supervisor(server, None, RestartPolicy(first_delay_s=0.5))
    supervisor.start()
    supervising = threading.Thread(target=supervisor.run, daemon=True)
    supervising.start()
    try:
        soak = _soak(server, ["trivial"], [])
        soak.supervisor = supervisor
        killed, fronts = server.pid, [front.pid for front in server.fronts]
        kill_server(soak)
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
