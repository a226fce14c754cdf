"""The fronts' client shares, deadlines and large-body checks without a server (fault matrix rows 38
and 56–59); the fault matrix runs them against the real server (tests/faults/test_deadlines_and_shares.py,
test_http_hang_ups.py, test_large_json.py)."""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Callable

import pytest
from tritonclient.grpc import service_pb2

from server.fronts.allow_list import ModelSignature
from server.fronts.body_checks import BodyCheckers
from server.fronts.client_slots import ClientSlots, Deadlines, SlotLimits, StreamWaits
from server.fronts.kserve_json import check_infer
from server.fronts.refusal import Refusal, RequestRefusedError

HANG_GUARD_S = 30.0  # how long the event loop may take to get somewhere: not a latency bound


async def _until(done: Callable[[], bool]) -> None:
    """Let the loop run until ``done()`` (a hang guard, never a bound on how fast)."""
    give_up = time.monotonic() + HANG_GUARD_S
    while not done():
        assert time.monotonic() < give_up, "the event loop never got there"
        await asyncio.sleep(0.01)


def test_a_client_over_its_share_is_refused_at_once() -> None:
    async def run() -> None:
        slots = ClientSlots(SlotLimits(capacity=10, per_address=3, per_connection=2))
        async with slots.held("a", "a:1"), slots.held("a", "a:1"):
            with pytest.raises(RequestRefusedError, match=r"connection \(a:1\) already has 2") as refusal:
                async with slots.held("a", "a:1"):
                    pass
            assert refusal.value.kind == Refusal.TOO_MANY
            async with slots.held("a", "a:2"):
                with pytest.raises(RequestRefusedError, match=r"address \(a\) already has 3 requests"):
                    async with slots.held("a", "a:3"):
                        pass
        assert slots.taken == 0 and not slots.by_address and not slots.by_connection

    asyncio.run(run())


def test_a_free_slot_goes_to_the_waiting_address_holding_the_fewest() -> None:
    """Two addresses flood a front of 4 slots; a third that sends one request is served at the next
    free slot, before the flooders' queued ones."""

    async def run() -> list[str]:
        slots = ClientSlots(SlotLimits(capacity=4, per_address=64, per_connection=64))
        order: list[str] = []
        release = asyncio.Event()

        async def request(address: str) -> None:
            async with slots.held(address, f"{address}:1"):
                order.append(address)
                await release.wait()

        flood = [asyncio.create_task(request(a)) for a in ("a", "b") * 4]
        await asyncio.sleep(0)
        assert slots.taken == 4 and sum(len(q) for q in slots.queues.values()) == 4
        newcomer = asyncio.create_task(request("c"))
        await asyncio.sleep(0)
        release.set()
        await asyncio.gather(*flood, newcomer)
        return order

    order = asyncio.run(run())
    assert order[:4] == ["a", "b", "a", "b"] and order[4] == "c", order


def test_a_wait_that_is_given_up_leaves_the_queue() -> None:
    async def run() -> None:
        slots = ClientSlots(SlotLimits(capacity=1))
        async with slots.held("a", "a:1"):
            with pytest.raises(RequestRefusedError, match="no slot of the 1 to tritonserver freed within"):
                async with slots.held("b", "b:1", wait_s=0.05):
                    pass
            waiter = asyncio.create_task(slots.held("c", "c:1").__aenter__())
            await asyncio.sleep(0)
            waiter.cancel()
            await asyncio.sleep(0)
        assert slots.taken == 0 and not slots.queues and not slots.by_address

    asyncio.run(run())


def test_a_model_slower_than_its_deadline_gets_504_and_is_counted_overdue() -> None:
    """The client's slot is freed at the deadline; the upstream exchange runs on, counted against
    its model, and the model is refused while ``max_overdue`` such exchanges run."""

    async def run() -> None:
        slots = ClientSlots(SlotLimits())
        deadlines = Deadlines(slots, max_overdue=1)
        answer = asyncio.Event()

        async def slow() -> str:
            await answer.wait()
            return "late"

        with pytest.raises(RequestRefusedError) as refusal:
            await deadlines.within("a", "a:1", "slow", 0.05, slow)
        assert refusal.value.kind == Refusal.DEADLINE
        assert str(refusal.value).startswith("model 'slow' did not answer within its deadline of 0.05 s")
        assert slots.taken == 0 and deadlines.overdue["slow"] == 1
        with pytest.raises(RequestRefusedError, match="'slow' already has 1 requests past their deadline"):
            await deadlines.within("b", "b:1", "slow", 1, slow)

        async def quick() -> str:
            return "ok"

        assert await deadlines.within("b", "b:1", "other", 1, quick) == "ok"
        answer.set()
        for _ in range(5):
            await asyncio.sleep(0)
        assert not deadlines.overdue

    asyncio.run(run())


def test_a_client_that_goes_away_while_it_waits_for_a_slot_leaves_the_queue() -> None:
    """Nothing of it reached Triton: its request is dropped and frees its share at once."""

    async def run() -> None:
        slots = ClientSlots(SlotLimits(capacity=1))
        deadlines = Deadlines(slots)
        answer = asyncio.Event()
        sent: list[str] = []

        async def upstream(who: str) -> str:
            sent.append(who)
            await answer.wait()
            return who

        first = asyncio.create_task(deadlines.within("a", "a:1", "m", 60, lambda: upstream("a")))
        gone = asyncio.create_task(deadlines.within("b", "b:1", "m", 60, lambda: upstream("b")))
        await _until(lambda: bool(slots.queues))
        assert sent == ["a"] and slots.by_address["b"] == 1
        gone.cancel()
        await _until(lambda: not slots.queues)
        assert "b" not in slots.by_address and "b:1" not in slots.by_connection
        answer.set()
        assert await first == "a" and sent == ["a"]
        assert slots.taken == 0 and not deadlines.overdue

    asyncio.run(run())


def test_a_request_forwarded_keeps_its_slot_when_its_client_goes_away() -> None:
    """Fault matrix row 38: Triton runs a request whose client hung up, so the exchange is not cancelled
    and the client's share counts it until Triton answers; the client's next request beyond its share is
    refused meanwhile."""

    async def run() -> None:
        slots = ClientSlots(SlotLimits(per_address=1))
        deadlines = Deadlines(slots)
        started, answer = asyncio.Event(), asyncio.Event()
        cancelled: list[bool] = []

        async def upstream() -> str:
            started.set()
            try:
                await answer.wait()
            except asyncio.CancelledError:
                cancelled.append(True)
                raise
            return "answered"

        caller = asyncio.create_task(deadlines.within("a", "a:1", "m", 60, upstream))
        await started.wait()
        caller.cancel()  # the client hung up
        with pytest.raises(asyncio.CancelledError):
            await caller
        await asyncio.sleep(0.01)
        assert not cancelled, "the exchange Triton still runs was cancelled"
        assert slots.taken == 1 and slots.by_address["a"] == 1 and slots.by_connection["a:1"] == 1
        with pytest.raises(RequestRefusedError, match=r"address \(a\) already has 1 requests") as refusal:
            await deadlines.within("a", "a:2", "m", 60, upstream)
        assert refusal.value.kind == Refusal.TOO_MANY
        answer.set()
        await _until(lambda: slots.taken == 0)
        assert not slots.by_address and not slots.by_connection and not deadlines.overdue

    asyncio.run(run())


def test_a_cancel_passed_on_keeps_the_slot_until_triton_runs_a_later_request() -> None:
    """Row 78 with ``cancel_passes_on`` (the gRPC front): the exchange of a request whose client reset it
    is cancelled (Triton is told), yet its slot stays held, as Triton answers it no more, until Triton
    answers a request of the same model forwarded after it: Triton's queue is first in, first out, so the
    cancelled one is behind it by then. An answer of a request forwarded before it frees nothing, nor an
    error for one forwarded after it (Triton may refuse a request before its queue)."""

    async def run() -> None:
        slots = ClientSlots(SlotLimits(per_connection=2))
        deadlines = Deadlines(slots)
        answers = {who: asyncio.Event() for who in ("earlier", "cancelled", "refused", "later")}
        cancelled: list[str] = []

        async def upstream(who: str) -> str:
            try:
                await answers[who].wait()
            except asyncio.CancelledError:
                cancelled.append(who)
                raise
            if who == "refused":
                raise RuntimeError("refused before the queue")
            return who

        def call(who: str, connection: str) -> asyncio.Task:
            exchange = functools.partial(upstream, who)
            return asyncio.create_task(
                deadlines.within("a", connection, "m", 60, exchange, cancel_passes_on=True)
            )

        earlier, reset = call("earlier", "a:1"), call("cancelled", "a:1")
        await _until(lambda: slots.taken == 2)
        reset.cancel()  # the client reset it
        await _until(lambda: cancelled == ["cancelled"])
        refused, later = call("refused", "a:2"), call("later", "a:2")
        await _until(lambda: slots.taken == 4)
        answers["earlier"].set()
        assert await earlier == "earlier"
        answers["refused"].set()
        with pytest.raises(RuntimeError):
            await refused
        await asyncio.sleep(0.01)
        assert slots.by_connection["a:1"] == 1, "a slot freed before Triton passed the cancelled request"
        answers["later"].set()
        assert await later == "later"
        await _until(lambda: slots.taken == 0)
        assert not slots.by_address and not slots.by_connection and not deadlines.queues.cancelled

    asyncio.run(run())


def test_a_request_whose_client_went_away_is_overdue_at_its_deadline() -> None:
    """The same accounting as for a client that waited and got its 504: the slot is freed at the
    deadline and the exchange counts against its model until Triton answers it."""

    async def run() -> None:
        slots = ClientSlots(SlotLimits())
        deadlines = Deadlines(slots, max_overdue=1)
        started, answer = asyncio.Event(), asyncio.Event()

        async def upstream() -> str:
            started.set()
            await answer.wait()
            return "late"

        caller = asyncio.create_task(deadlines.within("a", "a:1", "slow", 0.05, upstream))
        await started.wait()
        caller.cancel()
        await _until(lambda: bool(deadlines.overdue))
        assert deadlines.overdue["slow"] == 1 and slots.taken == 0 and not slots.by_address
        with pytest.raises(RequestRefusedError, match="'slow' already has 1 requests past their deadline"):
            await deadlines.within("b", "b:1", "slow", 1, upstream)
        answer.set()
        await _until(lambda: not deadlines.overdue)

    asyncio.run(run())


def _json_body(values: int) -> bytes:
    return json.dumps(
        {"inputs": [{"name": "x", "shape": [1, values], "datatype": "FP32", "data": [0.5] * values}]}
    ).encode()


def test_large_bodies_are_checked_in_a_worker_a_bounded_number_at_a_time() -> None:
    model = ModelSignature.from_config(
        "wide",
        {"max_batch_size": 1, "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [-1]}]},
        64 << 20,
    )

    async def run() -> None:
        checkers = BodyCheckers(workers=1, max_large=1, inline_bytes=1024)
        checkers.start()
        try:
            body = _json_body(1000)
            with checkers.place() as need:
                need(len(body))
                assert await checkers.check(len(body), check_infer, body, None, model) == []
                with (
                    pytest.raises(RequestRefusedError, match="send the tensor data as binary") as busy,
                    checkers.place() as another,
                ):
                    another(len(body))
                assert busy.value.kind == Refusal.TOO_MANY
            bad = body.replace(b'"FP32"', b'"INT64"')
            with checkers.place() as need, pytest.raises(RequestRefusedError, match="INT64 data must be"):
                need(len(bad))
                await checkers.check(len(bad), check_infer, bad, None, model)  # refused in the worker
            assert checkers.taken == 0
        finally:
            checkers.close()

    asyncio.run(run())


def test_a_stream_bounds_its_waiting_messages_and_names_the_late_one() -> None:
    waits = StreamWaits(limit=2)
    first = service_pb2.ModelInferRequest(model_name="slow", id="1")
    waits.add(first, deadline_s=0.0)
    waits.add(service_pb2.ModelInferRequest(model_name="fast", id="2"), deadline_s=60.0)
    with pytest.raises(RequestRefusedError, match="already has 2 requests waiting") as refusal:
        waits.add(first, deadline_s=60.0)
    assert refusal.value.kind == Refusal.TOO_MANY
    late = waits.overdue()
    assert late is not None and late.kind == Refusal.DEADLINE and "model 'slow'" in str(late)
    answer = service_pb2.ModelStreamInferResponse()
    answer.infer_response.id = "1"
    waits.answered(answer.SerializeToString())
    assert waits.overdue() is None and [w.request_id for w in waits.waiting] == ["2"]
