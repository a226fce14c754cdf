"""What the invariant fuzz puts on the wire and how it judges what comes back, without a server: the
data each drawn tensor carries (exactly its shape, or cut, lengthened, its BYTES prefixes broken), the
control request a stream must still answer, and each HTTP status and gRPC code sorted into answered,
refused, by policy or broken."""

from __future__ import annotations

import json

import pytest

from server.fronts.allow_list import ModelSignature
from server.fronts.kserve_json import check_infer
from server.fronts.refusal import RequestRefusedError
from server.fronts.tensor_limits import count_bytes_elements
from soak import request_space
from soak.fuzz_wire import (
    SLACK_S,
    Placed,
    carried,
    carried_inputs,
    control_case,
    grpc_answer,
    http_answer,
    http_body,
)
from soak.raw_http import HttpReply
from soak.request_space import BYTES_FAULTS, Case, ModelSpace, OutputCase, ShmRange, TensorCase, element_size
from tests.unit.soak.fuzz_spaces import ENCODER, LIMIT, SPACES, allowed


@pytest.mark.parametrize("space", SPACES, ids=lambda s: s.name)
def test_the_control_request_is_one_the_allow_list_accepts(space: ModelSpace) -> None:
    """The valid message a stream must still answer after the fuzzed one, and the other user's
    request, are valid by the config (else the fuzz would blame the server for its own request)."""
    allowed(space, control_case(space), seed=3)


@pytest.mark.parametrize("datatype", [*request_space.ELEMENT_BYTES, "FP99"])
def test_each_datatype_carries_exactly_its_shape(datatype: str) -> None:
    tensor = TensorCase("x", datatype, (2, 3), "binary", 6)
    data = carried(tensor, None, seed=1)
    if datatype == "BYTES":
        assert count_bytes_elements(data.raw, 6) == (6, len(data.raw))
    else:
        assert len(data.raw) == 6 * element_size(datatype)
    assert len(data.values) == 6


@pytest.mark.parametrize("fault", BYTES_FAULTS)
def test_a_bytes_fault_breaks_the_length_prefixes(fault: str) -> None:
    """Every BYTES fault leaves a buffer that is not exactly the shape's elements (the allow-list walks
    the same prefixes and refuses it)."""
    data = carried(TensorCase("t", "BYTES", (1, 3), "binary", 3, bytes_fault=fault), None, seed=2)
    assert count_bytes_elements(data.raw, 3) != (3, len(data.raw))


def test_bytes_cut_and_added() -> None:
    exact = carried(TensorCase("x", "FP32", (1, 4), "binary", 4), None, seed=0)
    short = carried(TensorCase("x", "FP32", (1, 4), "binary", 4, byte_delta=-1), None, seed=0)
    long = carried(TensorCase("x", "FP32", (1, 4), "binary", 4, byte_delta=4), None, seed=0)
    assert (len(short.raw), len(long.raw)) == (15, 20) and short.raw == exact.raw[:15]
    assert (len(short.values), len(long.values)) == (3, 5)


@pytest.mark.parametrize(
    ("datatype", "beyond", "typed"),
    [("UINT8", 256, True), ("INT16", 2**15, True), ("INT32", 2**31, False), ("FP32", 1e39, False)],
)
def test_a_value_beyond_its_datatype_goes_where_the_carrier_can_say_it(
    datatype: str, beyond: float, typed: bool
) -> None:
    """Fault matrix row 68: JSON says 256 as UINT8, and so does ``uint_contents`` (32-bit); a field as
    wide as its datatype cannot (protobuf refuses 2^31 in ``int_contents``, makes 1e39 infinity in
    ``fp32_contents``), and bytes never can: there the values stay the datatype's."""
    valid = carried(TensorCase("x", datatype, (1, 3), "json", 3), None, seed=4)
    data = carried(TensorCase("x", datatype, (1, 3), "json", 3, values="beyond-datatype"), None, seed=4)
    assert data.values == [beyond, *valid.values[1:]] and data.raw == valid.raw
    assert list(data.array) == ([beyond] if typed else [valid.array[0]]) + list(valid.array[1:])


@pytest.mark.parametrize(
    ("reply", "verdict"),
    [
        (HttpReply(200, b"{}"), "ok"),
        (HttpReply(400, b'{"error":"x"}'), "refused"),
        (HttpReply(413, b""), "refused"),
        (HttpReply(429, b""), "policy"),
        (HttpReply(504, b""), "policy"),
        (HttpReply(500, b""), "broken"),
        (HttpReply(502, b""), "broken"),
        (HttpReply(503, b""), "broken"),
        (HttpReply(failure="hang"), "broken"),
        (HttpReply(failure="closed: ConnectionResetError()"), "broken"),
        (HttpReply(failure="closed: no status line"), "broken"),
    ],
)
def test_an_http_answer_is_judged_by_its_status(reply: HttpReply, verdict: str) -> None:
    assert http_answer("infer", reply).verdict == verdict


@pytest.mark.parametrize(
    ("code", "details", "verdict"),
    [
        ("OK", "", "ok"),
        ("INVALID_ARGUMENT", "x", "refused"),
        ("NOT_FOUND", "x", "refused"),
        ("RESOURCE_EXHAUSTED", "x", "refused"),
        ("DEADLINE_EXCEEDED", "model 'slow' did not answer within its deadline of 3 s; …", "policy"),
        ("DEADLINE_EXCEEDED", "Deadline Exceeded", "broken"),  # the client's own timeout: a hang
        ("INTERNAL", "x", "broken"),
        ("UNAVAILABLE", "x", "broken"),
        ("UNKNOWN", "x", "broken"),
        ("CANCELLED", "x", "broken"),
    ],
)
def test_a_grpc_answer_is_judged_by_its_code(code: str, details: str, verdict: str) -> None:
    assert grpc_answer("infer", code, details, b"", SLACK_S).verdict == verdict


@pytest.mark.parametrize(
    ("output", "asked"),
    [
        (OutputCase("embedding", binary=True, shm=ShmRange("a0", 0, 1536)), "binary_data"),
        (OutputCase("embedding", shm=ShmRange("a0", 0, 1536), classification=3), "classification"),
    ],
)
def test_an_output_in_a_region_asking_for_more_goes_on_the_wire_and_is_refused(
    output: OutputCase, asked: str
) -> None:
    """Fault matrix row 76 as the fuzz draws it: an output in a region that also asks for binary data
    or a classification reaches the HTTP front with both parameters, which refuses it (the fuzz then
    holds the region unchanged and an answer a broken invariant)."""
    space = SPACES[0]
    tensors = control_case(space)
    case = Case(space.name, "http", tensors, (output,), seed=0)
    data = carried_inputs(tensors, space, 0)
    request = http_body(case, data, [None] * len(tensors), [Placed("fz_a0", 0, 1536)])
    parameters = json.loads(request.body)["outputs"][0]["parameters"]
    assert parameters["shared_memory_region"] == "fz_a0" and asked in parameters
    assert output.asks_more_than_its_region
    model = ModelSignature.from_config(space.name, ENCODER, LIMIT)
    with pytest.raises(RequestRefusedError, match=f"can't set both 'shared_memory_region' and '{asked}'"):
        check_infer(request.body, None, model)
