"""The invariant fuzz's parts without a server (tests/faults/test_invariant_fuzz.py drives them against
the real one): the request space read from a config, the data each drawn tensor carries, how answers
are judged, and the ledger that says which bytes of a region may change."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import seed as hypothesis_seed

from server.fronts.allow_list import CarriedInput, Carrier, ModelSignature, check_allowed
from server.fronts.refusal import RequestRefusedError
from server.fronts.tensor_limits import count_bytes_elements
from soak import request_space
from soak.fuzz_regions import ClientFile
from soak.fuzz_wire import SLACK_S, carried, control_case, grpc_answer, http_answer
from soak.other_uid import HttpReply
from soak.request_space import BYTES_FAULTS, Case, ModelSpace, TensorCase, cases, element_size

LIMIT = 64 << 20
# the text encoder as Triton serves it: two INT64 [-1, -1] inputs sharing a sequence axis of at most 16
ENCODER = {
    "name": "encoder",
    "max_batch_size": 32,
    "input": [
        {"name": "input_ids", "data_type": "TYPE_INT64", "dims": ["-1"]},
        {"name": "attention_mask", "data_type": "TYPE_INT64", "dims": ["-1"]},
    ],
    "output": [{"name": "embedding", "data_type": "TYPE_FP32", "dims": ["384"]}],
    "parameters": {
        "input_max_shapes": {"string_value": json.dumps({"input_ids": [16], "attention_mask": [16]})},
        "input_ranges": {"string_value": json.dumps({"input_ids": [0, 30522], "attention_mask": [0, 2]})},
    },
}
TEXT = {
    "name": "text",
    "max_batch_size": 8,
    "input": [{"name": "text", "data_type": "TYPE_STRING", "dims": [1]}],
    "output": [{"name": "embedding", "data_type": "TYPE_FP32", "dims": [384]}],
}
SPACES = [ModelSpace.from_config(c["name"], c, LIMIT, 60.0) for c in (ENCODER, TEXT)]


def test_a_model_space_is_read_from_the_served_config() -> None:
    encoder = SPACES[0]
    assert encoder.max_batch_size == 32 and encoder.deadline_s == 60.0
    ids, mask = encoder.inputs
    assert (ids.datatype, ids.dims, ids.bounds, ids.value_range) == ("INT64", (-1,), ((1, 16),), (0, 30522))
    assert mask.value_range == (0, 2) and ids.finite
    assert encoder.variable_axes() == {0: (1, 16)}
    assert [o.name for o in encoder.outputs] == ["embedding"]


def _allowed(space: ModelSpace, tensors: tuple[TensorCase, ...], seed: int) -> None:
    """``check_allowed`` of the fronts on what the fuzz would send for ``tensors`` (binary data)."""
    rules = {rule.name: rule for rule in space.inputs}
    signature = ModelSignature.from_config(space.name, ENCODER if space is SPACES[0] else TEXT, LIMIT)
    carried_inputs = [
        CarriedInput(t.name, t.datatype, t.shape, Carrier.BINARY, len(data.raw), data.raw)
        for t, data in zip(tensors, (carried(t, rules[t.name], seed) for t in tensors), strict=True)
    ]
    check_allowed(signature, carried_inputs, [])


@pytest.mark.parametrize("space", SPACES, ids=lambda s: s.name)
def test_the_control_request_is_one_the_allow_list_accepts(space: ModelSpace) -> None:
    """The valid message a stream must still answer after the fuzzed one, and the other user's
    request, are valid by the config (else the fuzz would blame the server for its own request)."""
    _allowed(space, control_case(space), seed=3)


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
        (HttpReply(failure="reset: ConnectionResetError()"), "broken"),
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


def test_only_changes_outside_the_allowed_ranges_count(tmp_path: Path) -> None:
    region = ClientFile(tmp_path / "r", "a", bytearray(b"abcdefghij"))
    assert region.changed_outside(b"abcdefghij") == []
    assert region.changed_outside(b"aXcdefgYYj") == [(1, 2), (7, 9)]
    region.allowed.append((6, 9))
    assert region.changed_outside(b"aXcdefgYYj") == [(1, 2)]
    assert region.changed_outside(b"abc") == [(3, 10)]


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@hypothesis_seed(0)
@given(cases(SPACES))
def test_every_drawn_case_prints_as_it_replays(case: Case) -> None:
    """A failing case is replayed from what hypothesis prints (``INVARIANT_FUZZ_CASE``): its repr is the
    case, and its data come from its seed alone."""
    names = {name: getattr(request_space, name) for name in request_space.REPLAYABLE}
    assert eval(repr(case), {"__builtins__": {}}, names) == case
    rules = {rule.name: rule for space in SPACES for rule in space.inputs}
    first = [carried(t, rules.get(t.name), case.seed + i).raw for i, t in enumerate(case.inputs)]
    again = [carried(t, rules.get(t.name), case.seed + i).raw for i, t in enumerate(case.inputs)]
    assert first == again


@settings(max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@hypothesis_seed(0)
@given(cases(SPACES))
def test_a_case_inside_every_bound_is_one_the_allow_list_accepts(case: Case) -> None:
    """The strategies' own notion of a valid request is the fronts' (so the fuzz reaches the models):
    a case without faults whose dims all sit inside their bounds passes ``check_allowed``. Hypothesis
    must find enough such cases among its draws (``assume``; else its health check fails the test)."""
    space = next((s for s in SPACES if s.name == case.model), None)
    assume(space is not None and sorted(t.name for t in case.inputs) == sorted(r.name for r in space.inputs))
    assert space is not None
    for tensor in case.inputs:
        rule = next(r for r in space.inputs if r.name == tensor.name)
        assume(
            tensor.datatype == rule.datatype
            and len(tensor.shape) == len(rule.dims) + 1
            and 1 <= tensor.shape[0] <= space.max_batch_size
            and all(low <= d <= high for d, (low, high) in zip(tensor.shape[1:], rule.bounds, strict=True))
            and tensor.elements == math.prod(tensor.shape)
            and tensor.byte_delta == 0
            and not tensor.bytes_fault
        )
    try:
        _allowed(space, case.inputs, case.seed)
    except RequestRefusedError as refusal:
        pytest.fail(f"{case} refused: {refusal}")
