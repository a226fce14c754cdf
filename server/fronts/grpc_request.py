"""What the gRPC front refuses of a call's decoded message: not the method's request type (row 40), an
input declaring more than its data carries or a typed value its datatype cannot hold (rows 19, 37,
39, 68), a request its model's config does not accept (rows 53–55), a name with a NUL (row 21).
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import DecodeError, Message
from tritonclient.grpc import service_pb2

from server.fronts.allow_list import CarriedInput, Carrier, ModelSignature, check_allowed
from server.fronts.client_regions import RegionUse
from server.fronts.refusal import RequestRefusedError
from server.fronts.tensor_limits import (
    check_declared_size,
    check_model_name,
    check_shape,
    check_value_fits,
    element_bytes,
)

SERVICE = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
REQUEST_TYPES = {
    method.name: getattr(service_pb2, method.input_type.name, None) for method in SERVICE.methods
}  # fmt: skip
INFER_METHODS = ("ModelInfer", "ModelStreamInfer")
NAME_FIELDS = ("name", "model_name")  # of the requests that carry a model (or region) name
CONTENTS = tuple(f.name for f in service_pb2.InferTensorContents.DESCRIPTOR.fields)


def parse_request(method: str, raw: bytes) -> Message | None:
    """The message of a call to ``method``, decoded (None: an unknown method, forwarded as it is)."""
    kind = REQUEST_TYPES.get(method)
    if kind is None:
        return None
    try:
        return kind.FromString(raw)
    except DecodeError as error:
        raise RequestRefusedError(f"{method}: not a valid {kind.__name__} message: {error}") from error


def model_to_check(method: str, request: Message) -> tuple[str, str] | None:
    """The (model, version) an inference call needs the config of, its name checked first."""
    if method not in INFER_METHODS:
        return None
    check_model_name(request.model_name)
    return request.model_name, request.model_version


def parameter_value(parameters: Any, key: str) -> Any:
    """The value of an ``InferParameter`` map entry, whichever type it holds (None when absent)."""
    if key not in parameters:
        return None
    parameter = parameters[key]
    choice = parameter.WhichOneof("parameter_choice")
    return getattr(parameter, choice) if choice else None


def region_use(parameters: Any, where: str) -> RegionUse | None:
    """The shared-memory range a tensor's parameters name, if any."""
    region = parameter_value(parameters, "shared_memory_region")
    if region is None:
        return None
    size = parameter_value(parameters, "shared_memory_byte_size")
    offset = parameter_value(parameters, "shared_memory_offset") or 0
    if not isinstance(size, int) or size < 0 or not isinstance(offset, int) or offset < 0:
        raise RequestRefusedError(
            f"{where}: shared memory byte size and offset must be non-negative integers"
        )
    return RegionUse(region, offset, size)


# The typed-contents field of each datatype (FP16 and BF16 have none: raw contents only)
TYPED_FIELDS = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
    "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
    "FP64": "fp64_contents", "BYTES": "bytes_contents",
}  # fmt: skip
# datatypes whose typed field is wider than they are: Triton casts such values unchecked (row 68)
WIDER_FIELD = ("INT8", "INT16", "UINT8", "UINT16")


def _check_typed(tensor: service_pb2.ModelInferRequest.InferInputTensor) -> None:
    """Typed contents in their datatype's field alone, each value one it holds."""
    field = TYPED_FIELDS.get(tensor.datatype)
    used = [name for name in CONTENTS if len(getattr(tensor.contents, name))]
    if field is None or any(name != field for name in used):
        expected = f"goes in {field}" if field else "has no typed contents field: send it as raw contents"
        raise RequestRefusedError(
            f"input {tensor.name!r}: {tensor.datatype} data {expected}, got {', '.join(used) or 'none'}"
        )
    values = getattr(tensor.contents, field)
    if values and tensor.datatype in WIDER_FIELD:
        for extreme in (min(values), max(values)):  # one its datatype holds, as over HTTP
            check_value_fits(tensor.name, tensor.datatype, extreme)


def check_infer_request(request: service_pb2.ModelInferRequest, model: ModelSignature) -> list[RegionUse]:
    """``RequestRefusedError`` unless ``model`` accepts the request; the ranges it names."""
    check_model_name(request.model_name)
    uses: list[RegionUse] = []
    carried: list[CarriedInput] = []
    raw = request.raw_input_contents
    raw_index = 0  # Triton hands raw contents, in order, to the inputs without shm or typed contents
    for tensor in request.inputs:
        shape = check_shape(tensor.name, list(tensor.shape))
        region = region_use(tensor.parameters, f"input {tensor.name!r}")
        per_element, payload = element_bytes(tensor.datatype), None
        if region is not None:
            uses.append(region)
            carrier, size, what = Carrier.SHARED_MEMORY, region.byte_size, "its shared memory range"
        elif tensor.HasField("contents"):
            if raw:
                raise RequestRefusedError(
                    f"input {tensor.name!r}: contents field must not be specified when using "
                    f"raw_input_contents for model {request.model_name!r}"
                )
            values = max(len(getattr(tensor.contents, field)) for field in CONTENTS)
            carrier, size, what, per_element = Carrier.TYPED, values, "its typed data", 1
        else:
            if raw_index >= len(raw):
                raise RequestRefusedError(
                    f"input {tensor.name!r} carries no data: no shared memory region, no typed contents "
                    "and no raw_input_contents entry for it"
                )
            payload = raw[raw_index]
            raw_index += 1
            carrier, size, what = Carrier.RAW, len(payload), "its raw data"
        check_declared_size(tensor.name, shape, per_element, size, what)
        if carrier is Carrier.TYPED:
            _check_typed(tensor)
        carried.append(CarriedInput(tensor.name, tensor.datatype, tuple(shape), carrier, size, payload))
    if raw_index != len(raw):
        raise RequestRefusedError(
            f"the request has {len(raw)} raw_input_contents entries for {raw_index} inputs sent as raw data"
        )
    for output in request.outputs:
        region = region_use(output.parameters, f"output {output.name!r}")
        if region is not None:
            if "classification" in output.parameters:  # as Triton refuses (fault matrix row 76)
                raise RequestRefusedError(
                    f"output {output.name!r} can't set both 'shared_memory_region' and 'classification'"
                )
            uses.append(region)
    check_allowed(model, carried, [output.name for output in request.outputs])
    return uses


def check_request(method: str, request: Message, model: ModelSignature | None = None) -> list[RegionUse]:
    """``RequestRefusedError`` unless the call may reach Triton; the ranges an inference names."""
    if method in INFER_METHODS:
        if model is None:
            raise ValueError(f"{method} is checked against its model's config; none was given")
        return check_infer_request(request, model)
    if not method.startswith(("SystemSharedMemory", "CudaSharedMemory")):
        for field in NAME_FIELDS:
            if field in request.DESCRIPTOR.fields_by_name:
                check_model_name(getattr(request, field))
    return []
