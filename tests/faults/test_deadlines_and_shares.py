"""Fault matrix rows 56–57: no request holds a slot longer than its model needs, and no group of
clients can take every slot from another.

Before: a request Triton did not answer held its HTTP front connection for 600 s, and four loopback
addresses of 64 requests each held all 256 of the HTTP front's upstream connections: every other client
waited for them, health and metadata aside. Here ``slow`` (``tests/faults/slow_model.py``, a real
Python-backend model) takes as long as a request asks, and its config sets ``request_deadline_s`` 3:
a request to it is answered 504 / ``DEADLINE_EXCEEDED`` naming the model and the deadline, its client's
slot is free at once (while Triton still runs it), and a fifth address is served while four others
flood. The same holds for a request whose tensors are in the client's shared memory (the fronts read
and write the region themselves). Assertions are on who is answered before what, never on how fast.
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from harness import content_length, exchange, url
from resilience_fixtures import build_small_repository
from shm_harness import client_module
from slow_model import DEADLINE_S, MAX_BATCH, SLOW, write_slow_model
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from client.connection import connect
from server import ServerOptions, TritonServer
from server.fronts.process import FrontShares

pytestmark = pytest.mark.integration
ANSWER_GUARD_S = 30  # not a latency bound: how long an answer may take before it counts as never
SLEEP_S = 60.0  # what a slow request asks for (the model's most): long after its deadline of 3 s
# every slow request of the module may be overdue at once; which of them the model's overdue share
# would refuse is the host's timing (a flood sent slowly meets its own first requests overdue), and
# that share is test_slow_calls_bounded's
MAX_OVERDUE = 1024
FLOOD_SLEEP_S = 45.0  # longer than ANSWER_GUARD_S: a front without deadlines starves the fifth address
LATE = (
    f"model '{SLOW}' did not answer within its deadline of {DEADLINE_S:g} s; the front stopped waiting "
    "and freed this request's slot"
)


@pytest.fixture(scope="module")
def server(spec_data: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    repository = build_small_repository(
        spec_data, tmp_path_factory.mktemp("deadline_repository"), pipeline=False
    )
    write_slow_model(repository)
    options = ServerOptions(
        repository=repository,
        http_front=True,
        grpc_front=True,
        self_heal=False,  # a stub asleep for 45 s is what this model does, not a stuck one to heal
        startup_timeout_s=240,
        stop_timeout_s=5,  # Triton still runs the flood (HTTP requests are not cancelled): do not wait
        exit_timeout_s=3,
        front_shares=FrontShares(max_overdue=MAX_OVERDUE),
        workdir=tmp_path_factory.mktemp("deadline_workdir"),
    )
    with TritonServer(options) as running:
        assert running.failed_models == {}, running.describe_failures()
        yield running


def _slow_json(seconds: float) -> bytes:
    return json.dumps(
        {"inputs": [{"name": "seconds", "shape": [1, 1], "datatype": "FP32", "data": [seconds]}]}
    ).encode()


def _post(path: str, body: bytes) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


SLOW_REQUEST = _post(f"/v2/models/{SLOW}/infer", _slow_json(SLEEP_S))
TRIVIAL = json.dumps(
    {"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}]}
).encode()
TRIVIAL_REQUEST = _post("/v2/models/trivial/infer", TRIVIAL)


def _slow_answered(server: TritonServer) -> int:
    """Requests ``slow`` has answered, as Triton counts them (its own port: the fronts are not asked)."""
    with urllib.request.urlopen(
        f"http://{server.triton_http_url}/v2/models/{SLOW}/stats", timeout=30
    ) as answer:
        stats = json.load(answer)["model_stats"]
    return sum(int(s["inference_stats"]["success"]["count"]) for s in stats)


def _grpc_slow(server: TritonServer) -> tuple[str, str]:
    request = service_pb2.ModelInferRequest(model_name=SLOW)
    request.inputs.add(name="seconds", datatype="FP32", shape=[1, 1])
    request.raw_input_contents.append(np.float32([SLEEP_S]).tobytes())
    with grpc.insecure_channel(server.grpc_url) as channel, pytest.raises(grpc.RpcError) as error:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=ANSWER_GUARD_S)
    return error.value.code().name, error.value.details()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_model_slower_than_its_deadline_is_answered_504_and_frees_the_slot(
    server: TritonServer, protocol: str
) -> None:
    """A request asking 60 s of a model whose deadline is 3 s: 504 / DEADLINE_EXCEEDED naming both,
    before Triton answers it; then the same client address sends its whole share (64) of requests
    at once and every one is served: the slow one no longer counts against it."""
    answered = _slow_answered(server)
    if protocol == "http":
        [(status, body)] = exchange(server, SLOW_REQUEST, timeout=ANSWER_GUARD_S)
        answer = (status, json.loads(body)["error"])
        assert answer == (504, LATE)
    else:
        assert _grpc_slow(server) == ("DEADLINE_EXCEEDED", LATE)
    assert _slow_answered(server) == answered, "Triton answered the slow request before the front's 504"
    with ThreadPoolExecutor(64) as pool:
        answers = list(
            pool.map(lambda _: exchange(server, TRIVIAL_REQUEST, timeout=ANSWER_GUARD_S)[0][0], range(64))
        )
    assert answers == [200] * 64
    assert _slow_answered(server) == answered, "the share was served only once Triton answered the slow one"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_request_in_shared_memory_has_the_same_deadline(server: TritonServer, protocol: str) -> None:
    """The slow request again, its input read from the client's own region and its output wanted
    there: 504 / DEADLINE_EXCEEDED like any other request (Triton cannot have answered it: it asks 60
    s), its output range untouched. Triton's success count is not compared here: the slow requests
    of the test above end meanwhile."""
    client = connect(protocol, url(server, protocol))
    module = client_module(protocol)
    name = f"deadline_{protocol}_{os.getpid()}"
    path = Path("/dev/shm") / name
    path.write_bytes(np.float32([SLEEP_S]).tobytes() + b"\xff" * 4)
    client.register_system_shared_memory(name, f"/{name}", 8)
    try:
        seconds = module.InferInput("seconds", [1, 1], "FP32")
        seconds.set_shared_memory(name, 4)
        slept = module.InferRequestedOutput("slept")
        slept.set_shared_memory(name, 4, offset=4)
        with pytest.raises(InferenceServerException) as late:
            client.infer(SLOW, [seconds], outputs=[slept])
        assert late.value.message() == LATE
        assert path.read_bytes()[4:] == b"\xff" * 4, "the output range was written"
    finally:
        client.unregister_system_shared_memory(name)
        path.unlink()
        client.close()  # here, not in whichever thread collects it (gevent)


async def _send(port: int, source: str, request: bytes, guard_s: float) -> tuple[int, bytes]:
    """One request from the loopback address ``source``; (status, body), status 0 if unanswered."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    try:
        writer.write(request)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), guard_s)
        body = await asyncio.wait_for(reader.readexactly(content_length(head)), guard_s)
        return int(head.split()[1]), body
    except TimeoutError:
        return 0, b""
    finally:
        writer.close()


def _pending(server: TritonServer) -> int:
    """Requests for ``slow`` Triton holds that no instance runs yet."""
    with urllib.request.urlopen(server.metrics_url, timeout=30) as answer:
        lines = answer.read().decode().splitlines()
    found = [
        line
        for line in lines
        if line.startswith("nv_inference_pending_request_count") and f'model="{SLOW}"' in line
    ]
    return int(float(found[0].rsplit(" ", 1)[1])) if found else 0


def test_four_addresses_of_64_cannot_starve_a_fifth(server: TritonServer) -> None:
    """127.0.0.2–5 send 64 slow requests each, all 256 of the HTTP front's upstream slots; once Triton
    holds them, 127.0.0.6 sends one small request: it is served, and the 256 are each answered 504
    (before: it waited until Triton answered the flood, 45 s and more, 600 s for requests never
    answered)."""
    port = int(server.http_url.rsplit(":", 1)[1])
    flood_request = _post(f"/v2/models/{SLOW}/infer", _slow_json(FLOOD_SLEEP_S))

    async def scenario() -> tuple[list[tuple[int, bytes]], tuple[int, bytes], int]:
        flood = [
            asyncio.create_task(
                _send(port, f"127.0.0.{address}", flood_request, FLOOD_SLEEP_S + ANSWER_GUARD_S)
            )
            for address in range(2, 6)
            for _ in range(64)
        ]
        loop = asyncio.get_running_loop()
        held = 0
        for _ in range(int(ANSWER_GUARD_S / 0.1)):  # until Triton holds the flood, one batch running
            held = await loop.run_in_executor(None, _pending, server)
            if held >= 256 - MAX_BATCH or all(task.done() for task in flood):
                break
            await asyncio.sleep(0.1)
        fifth = await _send(port, "127.0.0.6", TRIVIAL_REQUEST, ANSWER_GUARD_S)
        return await asyncio.gather(*flood), fifth, held

    flood, (status, body), held = asyncio.run(scenario())
    assert held >= 256 - MAX_BATCH, f"the flood never reached Triton whole ({held} waiting there)"
    assert status == 200, (
        f"the fifth address was not served within {ANSWER_GUARD_S} s: {status} {body[:200]!r}"
    )
    assert json.loads(body)["outputs"][0]["shape"] == [1, 16]
    assert sorted({s for s, _ in flood}) == [504], sorted({s for s, _ in flood})
    assert {json.loads(b)["error"] for _, b in flood} == {LATE}
