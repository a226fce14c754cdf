"""Fault matrix row 35: the HTTP front decides on the route Triton runs, whatever the request target's
spelling.

Before: the front matched ``/v2/systemsharedmemory/unregister#x`` with its fragment (no route, so no
check) while Triton dropped the fragment and unregistered every client's regions without the admin
key; a huge declared shape went the same way and aborted tritonserver. A seeded fuzz of request
targets (``soak.http_fuzz.mutate_target``), sent on raw sockets because HTTP clients normalise URLs,
spells every route ``make serve`` exposes in ways a front and Triton could read differently, with
good traffic alongside. Each spelling must be refused as a 400 JSON naming the problem, or reach the
route the front checked: never an answer of 500 or more, never a success where the plain spelling is
refused, and the plain answer itself when only the query differs.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

import pytest
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shared_memory

from server import TritonServer
from server.fronts.http_front import checked_target
from server.fronts.refusal import RequestRefusedError
from server.stubs import server_stubs
from soak.http_fuzz import mutate_target
from soak.raw_http import Request, exchange

pytestmark = pytest.mark.integration
CASES = 400
JSON = [("Content-Type", "application/json")]
# /dev/shm is one namespace for the host: a second `make test` beside this one runs this test too
OWN_REGION = f"target_fuzz_{os.getpid()}"


@dataclass(frozen=True)
class Probe:
    """A plain request to one route; its spellings are compared with its own answer."""

    method: str
    path: str
    body: bytes = b""


def _infer(model: str, inputs: list[dict]) -> Probe:
    return Probe("POST", f"/v2/models/{model}/infer", json.dumps({"inputs": inputs}).encode())


def _probes(server: TritonServer) -> list[Probe]:
    stub_region = next(Path("/dev/shm").glob(f"{server.shm_prefix}*")).name
    empty_ids = {"shape": [2**62, 0], "datatype": "INT64", "data": []}
    return [
        Probe("GET", "/v2/health/ready"),
        Probe("GET", "/v2/models/trivial/config"),
        Probe("GET", "/v2/models/stats"),
        _infer(  # a good one, on another model than good traffic's (whose count the server checks)
            "recommender",
            [
                {"name": "dense", "shape": [1, 13], "datatype": "FP32", "data": [0.5] * 13},
                {"name": "sparse_ids", "shape": [1, 8], "datatype": "INT64", "data": [1] * 8},
            ],
        ),
        # a huge declared shape in a small body (Triton alone: SIGABRT)
        _infer("recommender", [{"name": "dense", "shape": [2**40, 13], "datatype": "FP32", "data": [0]}]),
        # a shape Triton never answered (row 37)
        _infer("text_embedding_encoder", [{"name": n, **empty_ids} for n in ("input_ids", "attention_mask")]),
        Probe("POST", "/v2/systemsharedmemory/unregister"),  # every region of this client: 200
        Probe("POST", f"/v2/systemsharedmemory/region/{OWN_REGION}/unregister"),  # its owner may: 200
        Probe(
            "POST",
            f"/v2/systemsharedmemory/region/{stub_region}/register",
            json.dumps({"key": f"/{stub_region}", "byte_size": 64}).encode(),
        ),  # a stub's IPC region: 403
        Probe("GET", "/v2/systemsharedmemory/status"),
        Probe("POST", "/v2/repository/index", b"{}"),  # keyed: 403
        Probe("POST", "/v2/repository/models/trivial/unload", b"{}"),  # keyed: 403
    ]


def _answer(host: str, port: int, probe: Probe, target: str) -> tuple[int | None, str]:
    answer = exchange((host, port), Request(probe.method, target, JSON if probe.body else [], probe.body))
    if answer.failure:
        return None, answer.failure
    try:
        error = json.loads(answer.body).get("error", "") if answer.body else ""
    except (ValueError, AttributeError):
        error = f"(not JSON) {answer.body[:80]!r}"
    return answer.status, error


def _refused_here(target: str) -> bool:
    """Does the front's target check refuse ``target``? Spaces before it are the request line's (the
    parser skips them, and the front forwards the path it read)."""
    try:
        checked_target(target.lstrip(" "))
    except RequestRefusedError:
        return True
    return False


def _problem(
    probe: Probe, plain: tuple[int | None, str], target: str, answer: tuple[int | None, str]
) -> str | None:
    """What is wrong with ``answer`` to ``target``, a spelling of ``probe`` whose own answer is
    ``plain`` (None: nothing). A spelling the front accepts on another path reaches another route for
    Triton too (Triton matches raw, case-sensitive paths: a 404 here), never the plain one unchecked."""
    status, error = answer
    if status is None or status >= 500:
        return f"answered {status} {error!r}"
    if status == 400 and not error:
        return "a 400 without a JSON error"
    if 200 <= status < 300 and not 200 <= (plain[0] or 0) < 300:
        return f"succeeded ({status}) where the plain target gets {plain}"
    if _refused_here(target) and status != 400:
        return f"answered {status}, not refused"
    if (
        not _refused_here(target)
        and checked_target(target.lstrip(" "))[0] == probe.path
        and (status, error) != plain
    ):
        return f"answered {(status, error)}, the plain target {plain}"
    return None


def _unregisters_own(probe: Probe) -> bool:
    """Does the plain ``probe`` unregister this client's region (its own name, or all of its regions:
    the front serves shared memory per client)? Its answer is then 200, each time it is registered."""
    return probe.path in (
        "/v2/systemsharedmemory/unregister",
        f"/v2/systemsharedmemory/region/{OWN_REGION}/unregister",
    )


def _own_region(client: httpclient.InferenceServerClient):
    region = shared_memory.create_shared_memory_region(OWN_REGION, f"/{OWN_REGION}", 64)
    client.unregister_system_shared_memory(OWN_REGION)
    client.register_system_shared_memory(OWN_REGION, f"/{OWN_REGION}", 64)
    return region


def test_request_target_fuzz(fault_server: TritonServer, good_traffic) -> None:
    host, port = fault_server.http_url.rsplit(":", 1)
    client = httpclient.InferenceServerClient(fault_server.http_url)
    region = _own_region(client)
    pid = fault_server.pid
    stubs = {stub.pid for stub in server_stubs(pid or 0) if stub.alive}
    probes = _probes(fault_server)
    plain = {}
    for probe in probes:
        if _unregisters_own(probe):
            continue  # answered below, each time the region is registered again
        plain[probe] = _answer(host, int(port), probe, probe.path)
    assert plain[probes[0]][0] == 200 and plain[probes[3]][0] == 200, plain
    assert {plain[p][0] for p in probes[4:6]} == {400}, plain
    rng = random.Random(35)
    problems, refused = [], 0
    try:
        with good_traffic():
            for number in range(CASES):
                probe = rng.choice(probes)
                target, what = mutate_target(probe.path, rng)
                own = _unregisters_own(probe)
                expected = (200, "") if own else plain[probe]
                answer = _answer(host, int(port), probe, target)
                refused += answer[0] == 400 and "request target" in answer[1]
                problem = _problem(probe, expected, target, answer)
                if problem:
                    problems.append(f"case {number} {probe.method} {target!r} ({what}): {problem}")
                # no spelling of another route unregistered this client's region
                registered = [r["name"] for r in client.get_system_shared_memory_status()]
                if not own and OWN_REGION not in registered:
                    problems.append(f"case {number} {target!r} ({what}): unregistered the client's region")
                if own or OWN_REGION not in registered:
                    client.unregister_system_shared_memory(OWN_REGION)
                    client.register_system_shared_memory(OWN_REGION, f"/{OWN_REGION}", 64)
    finally:
        client.unregister_system_shared_memory(OWN_REGION)
        shared_memory.destroy_shared_memory_region(region)
    assert problems == [], "\n".join(problems[:20])
    assert refused > CASES // 3, refused  # most spellings are refused by the target check itself
    assert fault_server.pid == pid
    assert {stub.pid for stub in server_stubs(pid or 0) if stub.alive} >= stubs


@pytest.mark.parametrize(
    ("target", "why"),
    [
        ("/v2/systemsharedmemory/unregister#x", "has a '#' fragment"),
        ("/v2/models/..%2F..%2Fetc%2Fpasswd", "has the escape '%2F', a separator, dot or control character"),
        ("/v2/models/../../etc/passwd/infer", "has a '..' segment"),
        ("http://fuzz/v2/systemsharedmemory/unregister", "is not origin-form (a path starting with '/')"),
        ("/v2//systemsharedmemory/unregister", "has an empty segment ('//' or a trailing '/')"),
    ],
)
def test_a_target_that_is_not_plain_is_refused_naming_why(
    fault_server: TritonServer, target: str, why: str
) -> None:
    host, port = fault_server.http_url.rsplit(":", 1)
    answer = _answer(host, int(port), Probe("POST", target), target)
    assert answer == (400, f"request target {target!r} {why}; send a plain /v2/... path")
