"""Fault matrix row 58: thousands of gRPC calls that Triton would not answer in time are bounded, and
``python -m server stop`` drains afterwards.

Before: ``[0, 0]`` INT64 to the text encoder passed the gRPC front and Triton never answered it; a
few thousand of them grew tritonserver's memory without bound (each kept about 27 KB), and a ``make
stop`` then failed to drain. Here, on a server started and stopped by the real CLI (``python -m server
start`` / ``stop``, as ``make serve`` / ``make stop`` run it), each round sends 2,000 ``[0, 0]`` calls
and 2,000 calls to ``slow`` asking 5 s (its deadline is 3 s) at once on one connection: the first are
refused at once, the others are answered within the hang guard, each refused by the front
(``RESOURCE_EXHAUSTED``: over the client's share, or the model has its share of overdue requests) or
``DEADLINE_EXCEEDED`` naming the model, none answered in time; tritonserver's memory after four rounds is
within a bound of what it was after the first; and the stop drains.

What reaches Triton is bounded at every moment, whatever the timing: a call is let in only while it
has a slot of its client's share and the model has fewer than its share of overdue requests, so Triton
never holds more than the two shares together. Triton's own count of the requests it has waiting
(``nv_inference_pending_request_count``, read through the round) is held to that bound. How the
refusals split between the two shares is the host's timing (a loaded host sends the calls more slowly,
and a round meets the overdue ones of the round before), so it is not asserted.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import grpc
import numpy as np
import pytest
from resilience_fixtures import tree_environment
from slow_model import SLOW, write_slow_model
from tritonclient.grpc import service_pb2, service_pb2_grpc

from server.fronts.client_slots import DEFAULT_MAX_OVERDUE, SlotLimits
from server.proc_stat import running
from soak.attacks import PendingWatch
from tests.faults.harness import start_arguments

pytestmark = pytest.mark.integration
CALLS = 2000
ROUNDS = 4
HANG_GUARD_S = 60  # not a latency bound: how long a call may go unanswered before it counts as never
SLOW_ASKS_S = 5.0
# Memory: after the first round (what a first use allocates), three more rounds may add at most this;
# before, 2,000 unanswered [0, 0] calls kept about 54 MB a round.
GROWTH_BOUND = 32 << 20
ENCODER = "text_embedding_encoder"
PER_ADDRESS = SlotLimits().per_address  # the channel may open more than one connection
# the most requests of one client the front lets Triton hold for a model: in slots, and overdue
IN_TRITON_BOUND = PER_ADDRESS + DEFAULT_MAX_OVERDUE


@pytest.fixture(scope="module")
def checkout(fault_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with its own ``.run/`` and a ``model_repository`` of ``trivial``, the text encoder (the
    fault repository's, linked) and ``slow``."""
    folder = tmp_path_factory.mktemp("slow_calls_checkout")
    repository = folder / "model_repository"
    repository.mkdir()
    for model in ("trivial", ENCODER):
        (repository / model).symlink_to(fault_repository / model, target_is_directory=True)
    write_slow_model(repository)
    return folder


def _cli(checkout: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=checkout, env=tree_environment(), capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


def _never_answered() -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=ENCODER)
    for name in ("input_ids", "attention_mask"):
        request.inputs.add(name=name, datatype="INT64", shape=[0, 0])
        request.raw_input_contents.append(b"")
    return request


def _slow(shape: tuple[int, int] = (1, 1)) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=SLOW)
    request.inputs.add(name="seconds", datatype="FP32", shape=shape)
    request.raw_input_contents.append(np.full(shape, SLOW_ASKS_S, np.float32).tobytes())
    return request


KINDS = {  # (status, how the message starts) -> what the answer says
    ("INVALID_ARGUMENT", "input 'input_ids' for model 'text_embedding_encoder' has shape [0,0]"): "refused",
    ("RESOURCE_EXHAUSTED", "this client "): "over its share",  # its connection's or its address's
    ("DEADLINE_EXCEEDED", f"model '{SLOW}' did not answer within its deadline"): "late",
    ("RESOURCE_EXHAUSTED", f"model '{SLOW}' already has"): "overdue",
}


def _kind(code: str, details: str) -> str:
    """The kind of answer ``KINDS`` names, else the code with the start of its details (what to look into)."""
    found = (kind for (c, start), kind in KINDS.items() if c == code and details.startswith(start))
    return next(found, f"{code}: {details[:120]}")


async def _learn_configs(url: str) -> None:
    """Until the front answers one call of each model from the model's config: the rounds' calls are
    then checked against configs the front knows, which it keeps in use however slowly a starved host
    lets it hear Triton's refreshes (fault matrix row 74). A readiness wait, not part of what is tested:
    a front that never saw a model refuses a burst for it ``UNAVAILABLE`` when its first config fetch
    is not answered in time, which a loaded host can make happen."""
    async with grpc.aio.insecure_channel(url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for refused_by_its_config in (_never_answered(), _slow(shape=(1, 2))):
            give_up = time.monotonic() + HANG_GUARD_S
            while True:
                with pytest.raises(grpc.aio.AioRpcError) as error:
                    await stub.ModelInfer(refused_by_its_config, timeout=HANG_GUARD_S)
                if error.value.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > give_up:
                    break
            assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, error.value


async def _round(url: str) -> tuple[Counter, Counter]:
    """``CALLS`` of each kind at once on one channel: how each kind was answered (``KINDS``)."""
    async with grpc.aio.insecure_channel(url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

        async def one(request: service_pb2.ModelInferRequest) -> str:
            try:
                await stub.ModelInfer(request, timeout=HANG_GUARD_S)
            except grpc.aio.AioRpcError as error:
                return _kind(error.code().name, error.details() or "")
            return "answered by Triton"

        zeros = [one(_never_answered()) for _ in range(CALLS)]
        slow = [one(_slow()) for _ in range(CALLS)]
        answers = await asyncio.gather(*zeros, *slow)
    return Counter(answers[:CALLS]), Counter(answers[CALLS:])


def _rss(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS"))) << 10


def test_thousands_of_slow_calls_are_bounded_and_the_server_drains(checkout: Path) -> None:
    ports = start_arguments()
    started = _cli(checkout, "server", "start", *ports)
    assert started.returncode == 0, started.stderr[-3000:]
    state = json.loads((checkout / ".run" / "server.json").read_text())
    try:
        memory = []
        asyncio.run(_learn_configs(state["grpc"]))
        for _ in range(ROUNDS):
            with PendingWatch(state["metrics"], SLOW) as pending:
                zeros, slow = asyncio.run(_round(state["grpc"]))
            assert zeros == {"refused": CALLS}, zeros
            assert set(slow) <= {"over its share", "late", "overdue"}, slow  # none unanswered, none in time
            assert pending.reads > 0, "Triton's metrics never answered during the round"
            assert pending.most <= IN_TRITON_BOUND, (pending.most, slow)
            memory.append(_rss(state["pid"]))
        assert memory[-1] - memory[0] <= GROWTH_BOUND, f"tritonserver's RSS by round: {memory}"
    finally:
        stopped = _cli(checkout, "server", "stop")
    assert stopped.returncode == 0 and "drained: " in stopped.stdout, (stopped.stdout, stopped.stderr)
    assert not running(state["pid"])
