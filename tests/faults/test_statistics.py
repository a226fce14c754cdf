"""Fault matrix row 12: what Triton 2.51's own counters say about failed requests, so that every
figure we report takes failures from the right source.

Measured and asserted here (a newer Triton that fixes it fails this test, and docs/SERVING.md must change):
a Python-backend model's error response counts as a *success* in ``/v2/models/<m>/stats`` and in
``nv_inference_request_success``; an ensemble counts each failure of a composing model twice. So
succeeded/failed figures come from the client's own records (perf: one record per request; these
tests: the client's count), and the server's ``success`` is reported as "answered", never as "ok".
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from resilience_fixtures import COUNT_WAIT_S
from tritonclient.utils import InferenceServerException

from client.connection import connect
from client.stats import model_stats
from server import TritonServer

pytestmark = pytest.mark.integration


def _request(ids: int) -> list:
    dense = grpcclient.InferInput("dense", [1, 13], "FP32")
    dense.set_data_from_numpy(np.full((1, 13), 0.5, np.float32))
    sparse = grpcclient.InferInput("sparse_ids", [1, 8], "INT64")
    sparse.set_data_from_numpy(np.full((1, 8), ids, np.int64))
    return [dense, sparse]


@pytest.mark.parametrize(("model", "fail_factor"), [("recommender", 0), ("recommender_pipeline", 2)])
def test_failures_are_counted_from_the_client(fault_server: TritonServer, model: str, fail_factor) -> None:
    client = connect("grpc", fault_server.grpc_url)
    before = model_stats(client, "grpc", model)
    ok = failed = 0
    for ids in (1, -1, 2, 10**9, 3, -5):
        try:
            client.infer(model, _request(ids))
            ok += 1
        except InferenceServerException as error:
            assert error.status() == "StatusCode.INVALID_ARGUMENT", error.message()
            failed += 1
    assert (ok, failed) == (3, 3)  # the client's count: the figure we report
    # Triton records a request's statistics as it releases it, just after the response left: poll
    # until every request is counted (or COUNT_WAIT_S, a hang guard: a loaded host releases later),
    # then compare exactly.
    counted = ok + failed if fail_factor == 0 else ok + fail_factor * failed
    deadline = time.monotonic() + COUNT_WAIT_S
    while True:
        delta = model_stats(client, "grpc", model) - before
        if delta.requests + delta.failed >= counted or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if fail_factor == 0:  # a Python-backend model: its error responses count as successes
        assert (delta.requests, delta.failed) == (ok + failed, 0)
    else:  # an ensemble: failures are failures, counted twice
        assert (delta.requests, delta.failed) == (ok, fail_factor * failed)
