"""The two fronts side by side without a server: a request the invariant fuzz draws, written once for
HTTP and once for gRPC, is accepted by both fronts' checks or refused by both (docs/SERVING.md, "The
invariant fuzz"). The fuzz sends each case over one protocol and holds invariants a silent cast never
breaks (Triton answers 200 for 300 as UINT8); a door that lets through what the other refuses is
caught here.

JSON values pair with typed contents, binary data with raw contents, a shared-memory range with the
same range; values among bytes go as raw contents over gRPC, which cannot mix the two. Each front's
whole check of an inference is applied: its size bound, then ``kserve_json.check_infer`` or
``grpc_request.check_infer_request``. Not compared: what one protocol cannot say, a value beyond its
datatype that gRPC cannot carry (2^31 as INT32, 1e39 as FP32, any among raw contents), FP16 or BF16
values, which typed contents cannot carry and JSON can (Triton refuses them), and ``binary_data`` on
an output in a region, which gRPC cannot ask for."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from server.fronts.allow_list import ModelSignature
from server.fronts.grpc_request import check_infer_request
from server.fronts.kserve_json import check_infer
from server.fronts.refusal import RequestRefusedError
from soak.fuzz_wire import (
    Carried,
    Placed,
    beyond_datatype,
    carried_inputs,
    grpc_request,
    http_body,
    typed_carries,
)
from soak.request_space import Case, ModelSpace, TensorCase, cases
from tests.unit.soak.fuzz_spaces import ENCODER, LIMIT, NARROW, TEXT

CONFIGS = {config["name"]: config for config in (ENCODER, TEXT, NARROW)}
SPACES = {name: ModelSpace.from_config(name, config, LIMIT, 60.0) for name, config in CONFIGS.items()}
SIGNATURES = {name: ModelSignature.from_config(name, config, LIMIT) for name, config in CONFIGS.items()}
# each carrier of a drawn case as the other protocol says it
WRITTEN_AS = {
    "http": {"json": "json", "typed": "json", "binary": "binary", "raw": "binary", "shm": "shm"},
    "grpc": {"json": "typed", "typed": "typed", "binary": "raw", "raw": "raw", "shm": "shm"},
}
VALUE_CARRIERS = ("json", "typed")
EXAMPLES = 1500


def _mixed(case: Case) -> bool:
    """Whether ``case`` sends some inputs as values and others as bytes in the request: HTTP mixes JSON
    and binary data, gRPC cannot mix typed and raw contents (Triton refuses it), so there the values
    go as raw contents too."""
    carriers = {tensor.carrier for tensor in case.inputs}
    return bool(carriers & set(VALUE_CARRIERS)) and bool(carriers & {"binary", "raw"})


def _written_for(case: Case, protocol: str) -> Case:
    written = (
        dict(WRITTEN_AS[protocol], json="raw", typed="raw") if protocol == "grpc" and _mixed(case) else None
    )
    carriers = written or WRITTEN_AS[protocol]
    inputs = tuple(replace(tensor, carrier=carriers[tensor.carrier]) for tensor in case.inputs)
    return replace(case, protocol=protocol, inputs=inputs, headers=None)


def _said_alike(case: Case) -> bool:
    """Whether both protocols can say every input and output of ``case`` (the module's docstring)."""
    if any(output.binary and output.shm is not None for output in case.outputs or ()):
        return False
    for tensor in case.inputs:
        if tensor.carrier not in VALUE_CARRIERS:
            continue
        if tensor.values == "beyond-datatype" and _mixed(case):
            return False  # raw contents cannot say it
        if tensor.datatype in ("FP16", "BF16"):
            return False
        beyond = beyond_datatype(tensor.datatype)
        if (
            tensor.values == "beyond-datatype"
            and beyond is not None
            and not typed_carries(tensor.datatype, beyond)
        ):
            return False
    return True


def _beyond_in_typed_contents(tensor: TensorCase) -> bool:
    beyond = beyond_datatype(tensor.datatype)
    typed = tensor.carrier == "typed" and tensor.values == "beyond-datatype"
    return typed and beyond is not None and typed_carries(tensor.datatype, beyond)


def _placed(case: Case, data: list[Carried]) -> tuple[list[Placed | None], list[Placed | None]]:
    """The shared-memory ranges as sent: an input's byte size is its data's plus the range's delta
    unless the range names its own (as ``soak.fuzz_regions`` places them)."""
    inputs = [
        None
        if tensor.shm is None
        else Placed(
            tensor.shm.region,
            tensor.shm.offset,
            len(carried.raw) if tensor.shm.size is None else tensor.shm.size,
        )
        for tensor, carried in zip(case.inputs, data, strict=True)
    ]
    outputs = [
        None if output.shm is None else Placed(output.shm.region, output.shm.offset, output.shm.size or 0)
        for output in case.outputs or ()
    ]
    return inputs, outputs


def _verdict(check: Any, size: int, model: ModelSignature) -> str:
    """``accepted``, or ``refused: <why>`` (a body or message beyond the model's largest request is
    refused before it is read, by both fronts)."""
    if size > model.largest_request_bytes():
        return f"refused: {size} bytes, beyond the largest request"
    try:
        check()
    except RequestRefusedError as refusal:
        return f"refused: {refusal}"
    return "accepted"


def _over_http(case: Case, data: list[Carried], model: ModelSignature) -> str:
    request = http_body(case, data, *_placed(case, data))
    header_length = dict(request.headers).get("Inference-Header-Content-Length")
    return _verdict(lambda: check_infer(request.body, header_length, model), len(request.body), model)


def _over_grpc(case: Case, data: list[Carried], model: ModelSignature) -> str:
    message = grpc_request(case, data, *_placed(case, data))
    return _verdict(lambda: check_infer_request(message, model), message.ByteSize(), model)


def test_both_fronts_accept_or_refuse_each_drawn_request_alike() -> None:
    """Every drawn case said alike over both protocols gets one verdict class from both fronts; the
    draws must reach both verdicts, typed contents that carry a value beyond their datatype (300
    in ``uint_contents`` for UINT8: the narrow model's inputs), and an output in a region that also
    asks for a classification (row 76), which both refuse."""
    reached: Counter = Counter()

    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @hypothesis_seed(0)
    @given(cases(list(SPACES.values())), st.integers(-1, 3))
    def same_verdict(case: Case, beyond_at: int) -> None:
        if 0 <= beyond_at < len(case.inputs):  # the fuzz draws it rarely (one fault of 36): often here
            inputs = list(case.inputs)
            inputs[beyond_at] = replace(inputs[beyond_at], values="beyond-datatype")
            case = replace(case, inputs=tuple(inputs))
        model = SIGNATURES.get(case.model)
        assume(model is not None and _said_alike(case))
        assert model is not None
        data = carried_inputs(case.inputs, SPACES[case.model], case.seed)
        over_http = _over_http(_written_for(case, "http"), data, model)
        over_grpc = _over_grpc(_written_for(case, "grpc"), data, model)
        verdict = over_http.split(":")[0]
        assert verdict == over_grpc.split(":")[0], (
            f"{case}\n  over HTTP: {over_http}\n  over gRPC: {over_grpc}"
        )
        reached[verdict] += 1
        if any(_beyond_in_typed_contents(tensor) for tensor in _written_for(case, "grpc").inputs):
            reached[f"beyond its datatype in typed contents, {verdict}"] += 1
        if any(output.asks_more_than_its_region for output in case.outputs or ()):
            reached[f"an output in a region asking for more, {verdict}"] += 1

    same_verdict()
    assert reached["accepted"] and reached["refused"], reached
    assert reached["beyond its datatype in typed contents, refused"], reached
    assert reached["an output in a region asking for more, refused"], reached
    assert not reached["an output in a region asking for more, accepted"], reached
