"""Fault matrix row 59: one large JSON body does not hold up the HTTP front's other clients.

Before: a 60 MiB body of FP32 values was read for one reading (``server.fronts.kserve_json``) on the
front's only event loop, about 27 s during which no other client was answered. Here it is checked in
a worker process (``server.fronts.body_checks``): a small request sent once the large body has been
written whole is answered while the large one is still being checked. The large one is a text
request whose values are numbers, not strings, so it is refused once read (the text model's BYTES
input bounds no body below the front's 64 MiB, row 60). What is asserted is an order, not a time.
"""

from __future__ import annotations

import json
import threading

import pytest
from harness import exchange, raw_request

from server import TritonServer

pytestmark = pytest.mark.integration
ANSWER_GUARD_S = 300  # not a latency bound: how long the large body may take before it counts as never
VALUE = "0.12345678901234568"  # as Python writes a double: 19 characters and a comma per value
VALUES = (60 << 20) // (len(VALUE) + 1)
TRIVIAL = json.dumps({"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}]})


def _large_body() -> bytes:
    head = b'{"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": ['
    return head + ",".join([VALUE] * VALUES).encode() + b"]}]}"


def test_a_60_mib_json_body_does_not_hold_up_a_small_request(fault_server: TritonServer) -> None:
    body = _large_body()
    assert len(body) > 60 << 20
    request = raw_request(body, path="/v2/models/text_embedding/infer")
    written, large_answered = threading.Event(), threading.Event()
    large: list[tuple[int, bytes]] = []

    def send_large() -> None:
        large.extend(exchange(fault_server, request, timeout=ANSWER_GUARD_S, sent=written))
        large_answered.set()

    sender = threading.Thread(target=send_large, daemon=True)
    sender.start()
    assert written.wait(ANSWER_GUARD_S), "the large body was never taken in whole"
    [(status, answer)] = exchange(
        fault_server, raw_request(TRIVIAL.encode(), path="/v2/models/trivial/infer")
    )
    answered_first = not large_answered.is_set()
    sender.join(ANSWER_GUARD_S)
    assert status == 200 and json.loads(answer)["outputs"][0]["shape"] == [1, 16], answer[:200]
    assert answered_first, "the small request waited for the large body's check"
    expected = {"error": f"input 'text': BYTES data must be JSON strings, got {VALUE}"}
    assert large and (large[0][0], json.loads(large[0][1])) == (400, expected), large[:1]
