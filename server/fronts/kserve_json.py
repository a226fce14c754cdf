"""The KServe v2 JSON the HTTP front lets through: read once, the way Triton reads it (duplicate keys,
numbers beyond a double, lone surrogates and non-UTF-8 refused), each field of the type Triton reads
it as: a 400 naming the field where Triton says 500.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from server.fronts.allow_list import (
    CarriedInput,
    Carrier,
    ModelSignature,
    check_allowed,
    generate_input,
    raw_request_input,
)
from server.fronts.client_regions import RegionUse
from server.fronts.refusal import RequestRefusedError
from server.fronts.tensor_limits import (
    check_declared_size,
    check_shape,
    check_value_fits,
    element_bytes,
    integers_of,
    value_fits,
)

HEADER_LENGTH = re.compile(r"[0-9]{1,12}")
SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
MAX_DOUBLE_DIGITS = 308
U64 = 1 << 64


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document = dict(pairs)
    if len(document) != len(pairs):
        seen: set[str] = set()
        duplicate = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise RequestRefusedError(f"request JSON has the key {duplicate!r} twice in one object")
    return document


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DOUBLE_DIGITS:
        raise RequestRefusedError(
            f"request JSON holds an integer of {len(text)} digits, beyond any number type"
        )
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise RequestRefusedError(f"request JSON holds the number {text[:40]}, beyond a double")
    return value


def load_json(body: bytes) -> object:
    """Parse a request body as Triton's parser would, or ``RequestRefusedError`` saying why not."""
    try:
        text = body.decode("utf-8")
        document = json.loads(
            text, object_pairs_hook=_refuse_duplicates, parse_int=_parse_int, parse_float=_parse_float
        )
        if SURROGATE_ESCAPE.search(text):  # a lone surrogate escape parses, but is no Unicode Triton reads
            json.dumps(document, ensure_ascii=False).encode("utf-8")
    except UnicodeDecodeError as error:
        raise RequestRefusedError(f"request body is not UTF-8: {error}") from error
    except UnicodeEncodeError as error:
        raise RequestRefusedError("request JSON holds a lone UTF-16 surrogate escape") from error
    except RecursionError as error:
        raise RequestRefusedError("request JSON nests too deeply") from error
    except RequestRefusedError:
        raise
    except ValueError as error:
        raise RequestRefusedError(f"request body is not valid JSON: {error}") from error
    return document


def check_json(body: bytes) -> None:
    """``load_json`` without its result (a worker would send the document back for nothing)."""
    load_json(body)


def _field(container: dict, key: str, kinds: tuple[type, ...], where: str, required: bool = False) -> Any:
    """``container[key]`` if one of ``kinds`` (never a bool for an int; ints are uint64)."""
    if key not in container:
        if required:
            raise RequestRefusedError(f"{where}: '{key}' is missing")
        return None
    value = container[key]
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        expected = " or ".join(KIND_NAMES[k] for k in kinds)
        raise RequestRefusedError(f"{where}: '{key}' must be {expected}, got {json.dumps(value)[:40]}")
    if isinstance(value, int) and not isinstance(value, bool) and not 0 <= value < U64:
        expected = " or ".join(["a non-negative integer"] + [KIND_NAMES[k] for k in kinds if k is not int])
        raise RequestRefusedError(f"{where}: '{key}' must be {expected}, got {value}")
    return value


KIND_NAMES = {str: "a string", int: "an integer", bool: "true or false", dict: "an object", list: "a list"}


def _parameters(container: dict, where: str, kinds: dict[str, tuple[type, ...]]) -> dict:
    parameters = _field(container, "parameters", (dict,), where) or {}
    for key, allowed in kinds.items():
        _field(parameters, key, allowed, f"{where} parameters")
    return parameters


REQUEST_PARAMETERS = {
    "sequence_id": (int, str), "sequence_start": (bool,), "sequence_end": (bool,),
    "priority": (int,), "timeout": (int,), "binary_data_output": (bool,),
}  # fmt: skip
SHM_PARAMETERS = {
    "shared_memory_region": (str,), "shared_memory_byte_size": (int,), "shared_memory_offset": (int,),
}  # fmt: skip
INPUT_PARAMETERS = {"binary_data_size": (int,), **SHM_PARAMETERS}
PARAMETER_CARRIERS = ("binary_data_size", "shared_memory_region")  # an input's data, beside 'data'
OUTPUT_PARAMETERS = {"binary_data": (bool,), "classification": (int,), **SHM_PARAMETERS}


def _scalar_check(datatype: object) -> tuple[Callable[[object], bool], str] | None:
    """The type a JSON value of ``datatype`` must have, and its name (None: Triton refuses it)."""
    if datatype == "BOOL":
        return (lambda v: v is True or v is False), "true or false"
    if datatype == "BYTES":
        return (lambda v: isinstance(v, str)), "JSON strings"
    if datatype in ("FP16", "BF16", "FP32", "FP64"):
        return (lambda v: type(v) is float or type(v) is int), "JSON numbers"
    integers = integers_of(datatype)
    return None if integers is None else ((lambda v: type(v) is int), integers[2])


def _check_data(name: object, datatype: object, shape: list[int], data: object) -> None:
    """JSON ``data``: a list (nested any way) of exactly ``prod(shape)`` values Triton can read."""
    if not isinstance(data, list):
        raise RequestRefusedError(f"input {name!r}: 'data' must be a list, got {json.dumps(data)[:40]}")
    check, fits = _scalar_check(datatype), value_fits(datatype)
    count, pending = 0, [data]
    while pending:  # iterative: the parser has already bounded the nesting
        value = pending.pop()
        if isinstance(value, list):
            pending.extend(value)
            continue
        count += 1
        if check is not None and not check[0](value):
            raise RequestRefusedError(
                f"input {name!r}: {datatype} data must be {check[1]}, got {json.dumps(value)[:40]}"
            )
        if fits is not None and not fits(value):  # one its datatype holds (row 68), as over gRPC
            check_value_fits(name, datatype, value)
    if count != math.prod(shape):
        raise RequestRefusedError(
            f"input {name!r}: 'data' holds {count} values but shape {shape} needs {math.prod(shape)}"
        )


def region_use(parameters: dict, where: str) -> RegionUse | None:
    """The shared-memory range a tensor's parameters name, if any."""
    if "shared_memory_region" not in parameters:
        return None
    size = _field(parameters, "shared_memory_byte_size", (int,), f"{where} parameters", required=True)
    return RegionUse(parameters["shared_memory_region"], parameters.get("shared_memory_offset", 0), size)


def _read_input(item: object, body_bytes: int) -> tuple[CarriedInput, RegionUse | None]:
    """One entry of ``inputs`` and the range it names (binary data: ``_with_binary``)."""
    if not isinstance(item, dict):
        raise RequestRefusedError("each entry of 'inputs' must be an object")
    name = _field(item, "name", (str,), "input", required=True)
    where = f"input {name!r}"
    shape = check_shape(name, _field(item, "shape", (list,), where, required=True))
    datatype = _field(item, "datatype", (str,), where, required=True)
    parameters = _parameters(item, where, INPUT_PARAMETERS)
    carriers = ["'data'"] if "data" in item else []
    carriers += [f"'{key}' in 'parameters'" for key in PARAMETER_CARRIERS if key in parameters]
    if len(carriers) != 1:
        raise RequestRefusedError(
            f"{where} must set only one of the following fields: 'data', 'binary_data_size' in "
            f"'parameters', 'shared_memory_region' in 'parameters'. But "
            f"{' and '.join(carriers) if carriers else 'no field'} {'is' if len(carriers) < 2 else 'are'} set"
        )
    region = region_use(parameters, where)
    if region is not None:
        carrier, size = Carrier.SHARED_MEMORY, region.byte_size
    elif "binary_data_size" in parameters:
        carrier, size = Carrier.BINARY, parameters["binary_data_size"]
    else:
        check_declared_size(name, shape, 1, body_bytes, "the request")
        _check_data(name, datatype, shape, item["data"])
        return CarriedInput(name, datatype, tuple(shape), Carrier.JSON, math.prod(shape)), None
    check_declared_size(name, shape, element_bytes(datatype), size, carrier.value)
    return CarriedInput(name, datatype, tuple(shape), carrier, size), region


def _output_name(item: object, uses: list[RegionUse]) -> str:
    if not isinstance(item, dict):
        raise RequestRefusedError("each entry of 'outputs' must be an object")
    name = _field(item, "name", (str,), "output", required=True)
    parameters = _parameters(item, f"output {name!r}", OUTPUT_PARAMETERS)
    region = region_use(parameters, f"output {name!r}")
    if region is not None:
        # one place for its data, as Triton asks (fault matrix row 76): the front, which asks Triton for
        # a region's output as binary data, would answer what Triton refuses (a classification's strings
        # written into a region sized for the tensor)
        asked = [key for key in ("binary_data", "classification") if parameters.get(key, False) is not False]
        if asked:
            raise RequestRefusedError(
                f"Output {name!r} can't set both 'shared_memory_region' and '{asked[0]}'"
            )
        uses.append(region)
    return name


def _with_binary(carried: list[CarriedInput], body: bytes, header_bytes: int) -> list[CarriedInput]:
    """Each input sent as binary data with its bytes: they follow the header in the order of the inputs."""
    binary = sum(item.size for item in carried if item.carrier is Carrier.BINARY)
    if binary != len(body) - header_bytes:
        raise RequestRefusedError(
            f"inputs declare {binary} bytes of binary data but the body carries "
            f"{len(body) - header_bytes} after the JSON header"
        )
    offset, view = header_bytes, memoryview(body)
    for index, item in enumerate(carried):
        if item.carrier is Carrier.BINARY:
            carried[index] = replace(item, payload=view[offset : offset + item.size])
            offset += item.size
    return carried


def check_infer(body: bytes, header_length: str | None, model: ModelSignature) -> list[RegionUse]:
    """``RequestRefusedError`` unless ``model`` accepts the request; the ranges it names. ``header_length``
    ``0`` is Triton's raw request: the whole body is the one input's bytes."""
    header = body
    if header_length is not None:
        if not HEADER_LENGTH.fullmatch(header_length) or int(header_length) > len(body):
            raise RequestRefusedError(
                f"Inference-Header-Content-Length {header_length[:40]!r} must be a number of bytes "
                f"within the body ({len(body)} bytes)"
            )
        if int(header_length) == 0:
            check_allowed(model, [raw_request_input(model, len(body))], [])
            return []
        header = body[: int(header_length)]
    document = load_json(header)
    if not isinstance(document, dict):
        raise RequestRefusedError("request JSON must be an object with an 'inputs' list")
    _field(document, "id", (str,), "request")
    _parameters(document, "request", REQUEST_PARAMETERS)
    inputs = _field(document, "inputs", (list,), "request", required=True)
    read = [_read_input(item, len(body)) for item in inputs]
    uses = [region for _, region in read if region is not None]
    outputs = [_output_name(item, uses) for item in _field(document, "outputs", (list,), "request") or []]
    check_allowed(model, _with_binary([carried for carried, _ in read], body, len(header)), outputs)
    return uses


def check_register(body: bytes) -> tuple[str, int, int]:
    """(key, offset, byte size) of a system shared-memory register body."""
    document = load_json(body)
    if not isinstance(document, dict):
        raise RequestRefusedError("shared memory register request must be a JSON object")
    where = "shared memory register request"
    key = _field(document, "key", (str,), where, required=True)
    offset = _field(document, "offset", (int,), where) or 0
    return key, offset, _field(document, "byte_size", (int,), where, required=True)


def check_generate(body: bytes, model: ModelSignature) -> None:
    """A generate request's JSON: inputs as values of their datatype, scalars as parameters."""
    document = load_json(body)
    if not isinstance(document, dict):
        raise RequestRefusedError("generate request must be a JSON object of input names to values")
    parameters = _field(document, "parameters", (dict,), "generate request") or {}
    scalars = [
        (key, value) for key, value in document.items() if key not in model.inputs and key != "parameters"
    ]
    for key, value in [*parameters.items(), *scalars]:
        if isinstance(value, dict | list) or value is None:
            raise RequestRefusedError(
                f"generate request: parameter {key!r} must be a string, number or boolean"
            )
    carried = []
    for name, value in document.items():
        if name not in model.inputs:
            continue
        values = value if isinstance(value, list) else [value]
        if any(isinstance(item, list | dict) for item in values):
            raise RequestRefusedError(
                f"The schema can not convert input '{name}' to tensor with proper shape"
            )
        datatype = model.inputs[name].datatype
        _check_data(name, datatype, [len(values)], values)
        carried.append(generate_input(model, name, len(values)))
    check_allowed(model, carried, [])
