"""A drawn ``Case`` on the wire (HTTP, ``ModelInfer`` or a stream) and each answer's verdict for invariant
(a): ``ok``; ``refused`` (4xx, a client-error code); ``policy`` (429, 504, the front's
``DEADLINE_EXCEEDED``); else ``broken``, no answer or a hang included."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import grpc
import numpy as np
from tritonclient.grpc import service_pb2
from tritonclient.utils import triton_to_np_dtype

from server.fronts.grpc_request import TYPED_FIELDS
from soak.fuzz_headers import CASINGS, http_headers
from soak.other_uid import GRPC_OPTIONS, SERVICE, grpc_call
from soak.raw_http import HttpReply, Request, address, exchange
from soak.request_space import Case, InputSpace, ModelSpace, OutputCase, TensorCase, data_fits

# past the deadline before an answer counts as a hang: a loaded 2-core host can be seconds late
SLACK_S = 15.0
CLIENT_FAULTS = {
    "INVALID_ARGUMENT", "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "FAILED_PRECONDITION",
    "OUT_OF_RANGE", "UNIMPLEMENTED", "UNAUTHENTICATED", "RESOURCE_EXHAUSTED",
}  # fmt: skip
FRONT_DEADLINE = "did not answer within its deadline"
# a gRPC code's verdict; any other is broken (DEADLINE_EXCEEDED is the front's only where it says so)
GRPC_VERDICTS = {"OK": "ok", "DEADLINE_EXCEEDED": "policy", **dict.fromkeys(CLIENT_FAULTS, "refused")}
ALL_VALUES = -(1 << 40)  # a byte delta that cuts a tensor's data to nothing
SMALL_INTEGERS = 10  # integers without a declared range are drawn from [0, 10)


@dataclass(frozen=True)
class Answer:
    """One answer for invariant (a), with every byte that came back for invariant (b)'s canary search."""

    what: str
    verdict: str
    status: str
    message: str
    elapsed_s: float
    payload: bytes = b""


def http_answer(what: str, reply: HttpReply) -> Answer:
    if reply.failure:
        return Answer(what, "broken", reply.failure, "", reply.elapsed_s)
    message = reply.body[:300].decode("utf-8", "replace")
    by_class = {2: "ok", 4: "refused"}.get(reply.status // 100, "broken")  # 2xx, 4xx, anything else
    verdict = "policy" if reply.status in (429, 504) else by_class
    return Answer(what, verdict, str(reply.status), message, reply.elapsed_s, reply.body)


def grpc_answer(what: str, code: str, details: str, payload: bytes, elapsed_s: float) -> Answer:
    if code == "DEADLINE_EXCEEDED" and FRONT_DEADLINE not in details:
        code = "hang"  # the client's own deadline passed: no answer in time
    return Answer(what, GRPC_VERDICTS.get(code, "broken"), code, details[:300], elapsed_s, payload)


@dataclass(frozen=True)
class Carried:
    """One input's data as ``raw`` bytes, JSON ``values`` and the ``array`` typed contents are made of."""

    raw: bytes
    values: list
    array: np.ndarray | list[bytes]


def _array(tensor: TensorCase, rule: InputSpace | None, rng: np.random.Generator) -> np.ndarray | list[bytes]:
    count, datatype = tensor.elements, tensor.datatype
    if datatype == "BYTES":
        lengths = rng.integers(1, 13, count)
        return [bytes(rng.integers(97, 123, n).astype(np.uint8)) for n in lengths]
    if datatype in ("FP16", "FP32", "FP64", "BF16"):
        values = rng.uniform(-4, 4, count).astype(np.float32)
        if tensor.values == "non-finite" and count:
            values[rng.integers(0, count)] = np.nan
        if datatype == "BF16":
            return (values.view(np.uint32) >> 16).astype(np.uint16)
        return values.astype(triton_to_np_dtype(datatype))
    if datatype == "BOOL":
        return rng.integers(0, 2, count).astype(np.bool_)
    kind = _integer(datatype) or np.uint8
    info = np.iinfo(kind)
    low, high = (0, SMALL_INTEGERS)
    if rule is not None and rule.value_range is not None and rule.datatype == datatype:
        low, high = max(rule.value_range[0], int(info.min)), min(rule.value_range[1], int(info.max) + 1)
    # half the time near the low bound: the recommender's ids [0, 10000) index tables of 10 rows too
    top = high if rng.integers(0, 2) and tensor.values != "low" else min(high, low + SMALL_INTEGERS)
    values = rng.integers(low, max(top, low + 1), count).astype(kind)
    if tensor.values == "out-of-range" and count:
        values[rng.integers(0, count)] = high if high <= info.max else info.min
    return values


def _bytes_buffer(items: Sequence[bytes], fault: str) -> bytes:
    """BYTES elements in binary form (a 4-byte little-endian length, then the bytes), with ``fault``."""
    parts = [len(item).to_bytes(4, "little") + item for item in items]
    if fault == "one-short" and parts:
        parts.pop()
    elif fault == "past-end" and parts:
        parts[-1] = (len(items[-1]) + 1).to_bytes(4, "little") + items[-1]
    elif fault == "huge-length" and parts:
        parts[0] = b"\xff\xff\xff\xff" + parts[0][4:]
    buffer = b"".join(parts)
    if fault == "cut-prefix" and parts:
        buffer = buffer[: len(buffer) - len(parts[-1]) + 2]
    elif fault == "trailing":
        buffer += b"\x01\x02"
    return buffer


def beyond_datatype(datatype: str) -> float | None:
    """The nearest value past ``datatype`` that JSON can say, which Triton would cast unchecked (row 68)."""
    if datatype == "FP32":
        return 1e39
    kind = _integer(datatype)
    return None if kind is None else int(np.iinfo(kind).max) + 1


def _integer(datatype: str) -> type | None:
    kind = triton_to_np_dtype(datatype)
    return kind if kind is not None and np.issubdtype(kind, np.integer) else None


def typed_carries(datatype: str, value: float) -> bool:
    """Whether ``datatype``'s typed-contents field holds ``value`` as written, as protobuf itself says."""
    field = TYPED_FIELDS.get(datatype)
    if field is None:
        return False
    values = getattr(service_pb2.InferTensorContents(), field)
    try:
        values.append(value)
    except (TypeError, ValueError):
        return False
    return values[0] == value


def carried(tensor: TensorCase, rule: InputSpace | None, seed: int) -> Carried:
    """``tensor``'s data from ``seed`` with its faults (a value beyond the datatype first, where sayable)."""
    array = _array(tensor, rule, np.random.default_rng(seed))
    if isinstance(array, list):
        raw = _bytes_buffer(array, tensor.bytes_fault)
        values: list = [item.decode("ascii") for item in array]
    else:
        raw, values = array.tobytes(), array.tolist()
        beyond = beyond_datatype(tensor.datatype) if tensor.values == "beyond-datatype" else None
        if beyond is not None and values:
            values[0] = beyond
            if typed_carries(tensor.datatype, beyond):
                array = array.astype(object)
                array[0] = beyond
    delta = tensor.byte_delta
    if delta < 0:
        raw = raw[: max(len(raw) + delta, 0)]
        values = [] if delta == ALL_VALUES else values[:-1]
        array = array[:0] if delta == ALL_VALUES else array[:-1]
    elif delta > 0:
        raw += b"\x01" * delta
        values = values + values[-1:] if values else [0]
        array = array + array[-1:] if isinstance(array, list) else np.concatenate([array, array[-1:]])
    return Carried(raw, values, array)


def carried_inputs(tensors: Sequence[TensorCase], space: ModelSpace | None, seed: int) -> list[Carried]:
    """Every input's data, each from its own seed after ``seed``, within its rule where there is one."""
    rules = {rule.name: rule for rule in space.inputs} if space is not None else {}
    return [carried(tensor, rules.get(tensor.name), seed + i) for i, tensor in enumerate(tensors)]


def control_case(space: ModelSpace) -> tuple[TensorCase, ...]:
    """The model's smallest valid request (after a fuzzed stream message, and the other user's)."""
    axes = space.variable_axes()
    required = [rule for rule in space.inputs if not rule.optional] or list(space.inputs[:1])
    tensors = []
    for rule in required:
        dims = tuple(axes[axis][0] if dim == -1 else dim for axis, dim in enumerate(rule.dims))
        shape = (1, *dims) if space.batched else dims
        elements = data_fits(shape, rule.datatype)
        tensors.append(TensorCase(rule.name, rule.datatype, shape, "raw", elements, values="low"))
    return tuple(tensors)


@dataclass(frozen=True)
class Placed:
    """A shared-memory range as sent: the region's name, offset and byte size."""

    region: str
    offset: int
    size: int


def http_body(
    case: Case, data: Sequence[Carried], inputs: Sequence[Placed | None], outputs: Sequence[Placed | None]
) -> Request:
    """``case`` as an HTTP inference request, with the case's headers (``soak.fuzz_headers``)."""
    items, binary = [], []
    for tensor, carried_data, placed in zip(case.inputs, data, inputs, strict=True):
        item: dict = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}
        if placed is not None:
            item["parameters"] = _region_parameters(placed)
        elif tensor.carrier == "binary":
            item["parameters"] = {"binary_data_size": len(carried_data.raw)}
            binary.append(carried_data.raw)
        else:
            item["data"] = carried_data.values
        items.append(item)
    document: dict = {"inputs": items}
    if case.outputs is not None:
        document["outputs"] = [
            {"name": output.name, "parameters": _output_parameters(output, placed)}
            for output, placed in zip(case.outputs, outputs, strict=True)
        ]
    header = json.dumps(document).encode()
    headers, body = http_headers(case.headers, len(header) if binary else None, header + b"".join(binary))
    casing = CASINGS[case.headers.casing if case.headers is not None else "canonical"]
    return Request("POST", f"/v2/models/{case.model}/infer", headers, body, name_case=casing)


def _output_parameters(output: OutputCase, placed: Placed | None) -> dict:
    """An output's parameters over HTTP: its range, or ``binary_data``; with a range, ``binary_data``
    only when asked for (a fault, row 76), and a classification when drawn."""
    parameters = {"binary_data": output.binary} if placed is None or output.binary else {}
    if placed is not None:
        parameters.update(_region_parameters(placed))
    if output.classification:
        parameters["classification"] = output.classification
    return parameters


def _region_parameters(placed: Placed) -> dict:
    return {
        "shared_memory_region": placed.region,
        "shared_memory_offset": placed.offset,
        "shared_memory_byte_size": placed.size,
    }


def _set_region(parameters, placed: Placed) -> None:
    for key, value in _region_parameters(placed).items():
        setattr(parameters[key], "string_param" if isinstance(value, str) else "int64_param", value)


def grpc_request(
    case: Case,
    data: Sequence[Carried],
    inputs: Sequence[Placed | None],
    outputs: Sequence[Placed | None],
    request_id: str = "fuzz",
) -> service_pb2.ModelInferRequest:
    """``case`` as a ``ModelInferRequest``: raw contents in input order, or typed contents."""
    request = service_pb2.ModelInferRequest(model_name=case.model, id=request_id)
    for tensor, carried_data, placed in zip(case.inputs, data, inputs, strict=True):
        item = request.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=list(tensor.shape))
        if placed is not None:
            _set_region(item.parameters, placed)
        elif tensor.carrier == "typed":
            if tensor.datatype == "BYTES":
                item.contents.bytes_contents.extend(carried_data.array)
            elif tensor.datatype in TYPED_FIELDS:
                getattr(item.contents, TYPED_FIELDS[tensor.datatype]).extend(
                    np.asarray(carried_data.array).tolist()
                )
        else:
            request.raw_input_contents.append(carried_data.raw)
    for output, placed in zip(case.outputs or (), outputs, strict=False):
        wanted = request.outputs.add(name=output.name)
        if placed is not None:
            _set_region(wanted.parameters, placed)
        if output.classification:
            wanted.parameters["classification"].int64_param = output.classification
    return request


class Client:
    """The fuzz's own sockets to both fronts, answering as ``OtherUser``'s do."""

    def __init__(self, http_url: str, grpc_url: str) -> None:
        self.address = address(http_url)
        self.grpc_address = address(grpc_url)  # for calls grpcio will not send (soak.raw_grpc)
        self.channel = grpc.insecure_channel(grpc_url, options=GRPC_OPTIONS)

    def http(self, request: Request, timeout_s: float) -> HttpReply:
        return exchange(self.address, request, timeout_s)

    def grpc(
        self, method: str, request: bytes, timeout_s: float, compression: grpc.Compression | None = None
    ) -> tuple[str, str, bytes, float]:
        return grpc_call(self.channel, method, request, timeout_s, compression)

    def stream(
        self,
        messages: Sequence[service_pb2.ModelInferRequest],
        timeout_s: float,
        compression: grpc.Compression | None = None,
    ) -> tuple[Answer, dict[str, bool]]:
        """The stream's answer (``broken`` when a message got none) and, per message id, whether it was ok."""
        start, payload, answered = time.monotonic(), b"", {}
        call = self.channel.stream_stream(SERVICE + "ModelStreamInfer")
        try:
            sent = iter([m.SerializeToString() for m in messages])
            for raw in call(sent, timeout=timeout_s, compression=compression):
                payload += raw
                answer = service_pb2.ModelStreamInferResponse.FromString(raw)
                unanswered = [m.id for m in messages if m.id not in answered]
                key = answer.infer_response.id if answer.infer_response.id in unanswered else unanswered[0]
                answered[key] = not answer.error_message
            code, details = "OK", ""
        except grpc.RpcError as error:
            code, details = error.code().name, error.details() or ""
        except IndexError:
            code, details = "UNKNOWN", "more answers than messages on the stream"
        result = grpc_answer("stream", code, details, payload, time.monotonic() - start)
        missing = [m.id for m in messages if m.id not in answered]
        if result.verdict == "ok" and missing:
            unanswered = f"no answer for {missing}"
            result = replace(result, verdict="broken", status="unanswered", message=unanswered)
        return result, answered

    def close(self) -> None:
        self.channel.close()
