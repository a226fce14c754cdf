"""Fault matrix row 62: the invariant fuzz (``soak.invariant_fuzz``) over every model the fault
server serves, through both fronts, with a fixed seed and a short budget; ``make soak`` runs it
longer on the default repository.

Hypothesis draws each request from the served configs' bounds (``soak.request_space``); after every
one, (a) it was answered within its model's deadline (2xx, 4xx, or 429/504 by policy), (b) no
client's canary reached another client's answer or region and no region changed but where an answered
request named an output, (c) tritonserver, the fronts and every stub kept their PIDs; at the end
tritonserver's RSS is within the stated bound of the start. The run must also reach what it claims to
test: a valid request answered for every served model, shared-memory inputs and outputs over both
fronts, registrations accepted and refused, outputs in a region that also ask for binary data or a
classification refused over both fronts (row 76), the other user's requests, and the drawn headers
(``soak.fuzz_headers``): a valid request with its header names in a casing other than the canonical
one, a gzip answer read back, an output written into a region for a client that accepts a compressed answer
(the front reads Triton's answer itself there: a gzip one read as JSON was a 500), a body declared
gzip but sent plain refused, and gRPC messages compressed.

Budget and replay (docs/SERVING.md, "The invariant fuzz"): ``INVARIANT_FUZZ_EXAMPLES`` (cases, default
500) and ``INVARIANT_FUZZ_SEED`` (default 0); a failure prints hypothesis's smallest failing case and
its ``@reproduce_failure`` blob: ``INVARIANT_FUZZ_REPLAY='<version> <blob>'`` runs that case again, and
``INVARIANT_FUZZ_CASE='Case(...)'`` sends the printed case itself.
"""

from __future__ import annotations

import os

import pytest

from server import TritonServer
from soak.fuzz_headers import CASINGS, MISMATCH, VALID_METADATA, WIRE_FAULTS
from soak.invariant_fuzz import InvariantFuzz, run_examples
from soak.other_uid import OtherUser
from tests.unit.soak.fuzz_spaces import replayed

pytestmark = pytest.mark.integration
EXAMPLES = int(os.environ.get("INVARIANT_FUZZ_EXAMPLES", "500"))
SEED = int(os.environ.get("INVARIANT_FUZZ_SEED", "0"))


def test_invariants_hold_over_every_served_model(fault_server: TritonServer) -> None:
    with InvariantFuzz(fault_server) as fuzz:
        try:
            if os.environ.get("INVARIANT_FUZZ_CASE"):
                fuzz.check(replayed(os.environ["INVARIANT_FUZZ_CASE"]))  # a case as hypothesis printed it
            else:
                run_examples(fuzz, EXAMPLES, SEED, os.environ.get("INVARIANT_FUZZ_REPLAY", ""))
        finally:
            print(fuzz.report.text())
    report = fuzz.report
    assert report.passed, report.text()
    if os.environ.get("INVARIANT_FUZZ_CASE") or os.environ.get("INVARIANT_FUZZ_REPLAY"):
        return  # one case: nothing more to reach
    reached = report.covered
    assert not [m for m in report.models if not reached[f"ok {m}"]], "models no valid request reached"
    for front in ("http", "grpc"):
        assert reached[f"ok {front} shared-memory input"] and reached[f"ok {front} shared-memory output"]
    assert reached["registration own ok"] and reached["registration theirs refused"]
    assert {protocol for protocol, verdict in report.verdicts if verdict == "refused"} == {
        "http",
        "grpc",
        "stream",
    }
    unusual = [
        casing for casing in CASINGS if casing != "canonical" and reached[f"ok http {casing} header names"]
    ]
    assert unusual, "no valid request with its header names lower, upper or mixed case"
    assert reached["ok http answer in gzip"], "no gzip answer read back"
    compressed = (
        "ok http shared-memory output",
        "other uid infer ok",
    )  # both: the front reads Triton's answer
    assert any(reached[f"{what}, compressed answer accepted"] for what in compressed)
    assert reached[f"refused http {MISMATCH} body"] and not reached[f"ok http {MISMATCH} body"]
    assert reached["ok grpc gzip message"] and reached["ok stream gzip message"]
    for front in ("http", "grpc"):  # row 76, refused: an answer would have broken (a)
        assert reached[f"refused {front} shared-memory output asking for more, named"], front
    faults = [wire for wire in WIRE_FAULTS if wire != VALID_METADATA]
    assert any(reached[f"refused grpc wire {wire}"] for wire in faults), "no gRPC wire fault refused"
    if OtherUser.available():
        assert report.other_uid and reached["other uid infer ok"] and reached["other uid status ok"]
        assert reached["other uid infer ok, compressed answer accepted"]
