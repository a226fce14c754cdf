"""Fault matrix: overload beyond the queue (rejected at once, bounded) and reload under load (explicit
model control: no good request fails while a model is loaded again)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from harness import PROTOCOLS, trivial_inputs, url
from resilience_fixtures import wait_for
from tritonclient.utils import InferenceServerException

from client.connection import connect
from server import TritonServer
from server.admin import headers as admin_headers
from server.stubs import server_stubs
from tests.integration.bursts import bursts_until_refused

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_overload_beyond_the_queue_is_rejected(fault_server: TritonServer, good_traffic, protocol) -> None:
    """48 concurrent requests on a queue of 2 that waits 50 ms: the excess is rejected at once with
    the queue's message; every request is either answered or rejected (sent = ok + rejected). A burst
    that arrives slowly enough to find room is sent again (``bursts_until_refused``)."""

    def one(_: int) -> str:
        client = connect(protocol, url(fault_server, protocol))
        try:
            client.infer("trivial_tiny_queue", trivial_inputs(protocol))
            return "ok"
        except InferenceServerException as error:
            return "rejected" if "Exceeds maximum queue size" in error.message() else error.message()
        finally:
            client.close()  # in this thread: the gevent pool cannot be joined from the collector's

    with good_traffic(), ThreadPoolExecutor(24) as pool:
        outcomes = bursts_until_refused(one, pool, 48)
    assert outcomes.count("ok") + outcomes.count("rejected") == len(outcomes), set(outcomes)
    assert outcomes.count("rejected") > 0 and outcomes.count("ok") > 0


def _trivial_stubs(server: TritonServer) -> list[int]:
    return [stub.pid for stub in server_stubs(server.pid or 0) if stub.alive and stub.model == "trivial"]


def test_reload_under_load_loses_nothing(fault_server: TritonServer, good_traffic) -> None:
    """Loading ``trivial`` again (explicit control, with its own config as an override so Triton
    really reloads it) while good traffic runs on it: zero failures. The server's counters restart
    with the new model object, so only the client's count is checked here."""
    client = connect("http", fault_server.http_url)
    config = json.dumps(client.get_model_config("trivial"))
    loads = fault_server.log_path.read_text().count("successfully loaded 'trivial'")
    with good_traffic(minimum=60, server_count=False):
        for _ in range(2):
            client.load_model("trivial", config=config, headers=admin_headers(fault_server.admin_key))
            assert client.is_model_ready("trivial")
    assert fault_server.log_path.read_text().count("successfully loaded 'trivial'") == loads + 2
    # the replaced stubs exit on their own, a while later on a loaded host; the tests after this one
    # compare the server's stubs before and after them, so this one ends once only the new ones run
    instances = sum(group["count"] for group in json.loads(config)["instance_group"])
    wait_for(lambda: len(_trivial_stubs(fault_server)) == instances, "the replaced trivial stubs to exit")
