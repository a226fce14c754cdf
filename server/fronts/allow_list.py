"""The allow-list: a request reaches Triton only if the served model's config accepts it exactly,
whatever carries its inputs (fault matrix rows 37, 53–55 and 61; docs/SERVING.md, "What every
inference must be: the allow-list"). Each protocol's parser turns a request into ``CarriedInput``s;
``check_allowed`` holds them to the model's ``ModelSignature``, in Triton's words where it has them;
``server.fronts.signature_cache`` keeps each signature as Triton serves it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from python_backend.batching import beyond_max_shape, parse_max_shapes
from server.fronts.refusal import RequestRefusedError
from server.fronts.tensor_limits import MAX_ANY_DIM, check_dims_fit_int64, count_bytes_elements, element_bytes

MIN_SHAPES_PARAMETER = "input_min_shapes"  # JSON {input: [dims]}: a 0 lets that dim be 0
DEADLINE_PARAMETER = "request_deadline_s"  # the longest one request to the model may take, queue included
# The largest valid request: each element at most this many characters of JSON (a double's repr, a
# separator, a row's brackets; more than any binary element), plus HEADER_ALLOWANCE.
JSON_CHARS_PER_VALUE = 40
HEADER_ALLOWANCE = 64 << 10


class Carrier(Enum):
    """What carries an input's data, as a refusal names it."""

    JSON = "its JSON data"
    TYPED = "its typed contents"
    BINARY = "its binary data"
    RAW = "its raw data"
    SHARED_MEMORY = "its shared memory range"


@dataclass(frozen=True)
class CarriedInput:
    """One input of a request: ``size`` in values or bytes, ``payload`` where the front holds them."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    carrier: Carrier
    size: int
    payload: bytes | memoryview | None = None


def protocol_datatype(config_type: str) -> str:
    """A config's ``TYPE_FP32`` as the protocol's ``FP32`` (``TYPE_STRING`` is ``BYTES``)."""
    name = config_type.removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


@dataclass(frozen=True)
class InputRule:
    """One input's datatype and each config dim (no batch) within ``[low, high]``."""

    datatype: str
    fixed: tuple[int, ...]
    bounds: tuple[tuple[int, int], ...]
    optional: bool = False
    declared_max: tuple[int, ...] | None = None  # the input_max_shapes entry, when the config has one


def _dims_parameter(parameters: Mapping[str, Any], key: str) -> dict[str, tuple[int, ...]]:
    """``{input: dims}`` from the JSON parameter ``key``, by the backend's own reader."""
    try:
        return parse_max_shapes({"input_max_shapes": parameters.get(key) or {}})
    except ValueError:
        return {}


def _deadline(parameters: Mapping[str, Any]) -> float | None:
    text = (parameters.get(DEADLINE_PARAMETER) or {}).get("string_value", "")
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if 0 < value < math.inf else None


def _rule(item: Mapping[str, Any], max_shapes: dict, min_shapes: dict, body_limit: int) -> InputRule:
    name = str(item["name"])
    datatype = protocol_datatype(str(item.get("data_type", "")))
    fixed = tuple(int(d) for d in item.get("dims") or ())
    # an entry that fits no dims of this input counts as absent: the backend refuses to load with it
    declared_max, minimum = (
        dims if dims is not None and len(dims) == len(fixed) else None
        for dims in (max_shapes.get(name), min_shapes.get(name))
    )
    fixed_bytes = element_bytes(datatype) * math.prod(d for d in fixed if d > 0)
    # a -1 dim without a declared max: as long as one input of batch 1 can be and still fit the body
    derived = max(1, min(MAX_ANY_DIM, body_limit // max(fixed_bytes, 1)))
    bounds = []
    for axis, dim in enumerate(fixed):
        if dim >= 0:
            bounds.append((dim, dim))
            continue
        low = 0 if minimum is not None and minimum[axis] == 0 else 1
        high = declared_max[axis] if declared_max is not None else derived
        bounds.append((low, max(low, high)))
    return InputRule(datatype, fixed, tuple(bounds), bool(item.get("optional")), declared_max)


@dataclass(frozen=True)
class ModelSignature:
    """What one model's config, as Triton serves it, lets a request be."""

    model: str
    max_batch_size: int
    inputs: dict[str, InputRule]
    outputs: tuple[str, ...]
    body_limit: int
    deadline_s: float | None = None  # the request_deadline_s parameter, when the config has one

    @classmethod
    def from_config(cls, model: str, config: Mapping[str, Any], body_limit: int) -> ModelSignature:
        """From a config as JSON (gRPC's as a dict: int64 fields may come as strings)."""
        parameters = config.get("parameters") or {}
        shapes = [_dims_parameter(parameters, key) for key in ("input_max_shapes", MIN_SHAPES_PARAMETER)]
        inputs = {str(item["name"]): _rule(item, *shapes, body_limit) for item in config.get("input") or []}
        outputs = tuple(str(item["name"]) for item in config.get("output") or [])
        batch = int(config.get("max_batch_size") or 0)
        return cls(model, batch, inputs, outputs, body_limit, _deadline(parameters))

    @property
    def batched(self) -> bool:
        return self.max_batch_size > 0

    def largest_request_bytes(self) -> int:
        """The largest body a valid request can be (BYTES inputs: the front's limit)."""
        if any(rule.datatype == "BYTES" for rule in self.inputs.values()):
            return self.body_limit
        batch = max(self.max_batch_size, 1)
        values = sum(batch * math.prod(high for _, high in rule.bounds) for rule in self.inputs.values())
        return min(self.body_limit, HEADER_ALLOWANCE + values * JSON_CHARS_PER_VALUE)

    def allowed(self, name: str) -> str:
        """An input's dims as the config allows them: ``[1..64,13]``, ``[1..32,1..256]``."""
        rule = self.inputs[name]
        dims = [f"1..{self.max_batch_size}"] if self.batched else []
        dims += [str(low) if low == high else f"{low}..{high}" for low, high in rule.bounds]
        return "[" + ",".join(dims) + "]"


def _listed(dims: Iterable[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _quoted(names: Iterable[str]) -> str:
    return "[" + ",".join(f"'{name}'" for name in names) + "]"


def _check_names(model: ModelSignature, inputs: Sequence[CarriedInput]) -> None:
    """Every input of the model once, none it lacks (Triton's messages)."""
    counts = Counter(carried.name for carried in inputs)
    twice = next((name for name, count in counts.items() if count > 1), None)
    if twice is not None:
        raise RequestRefusedError(f"input '{twice}' already exists in request")
    unknown = next((name for name in counts if name not in model.inputs), None)
    if unknown is not None:
        raise RequestRefusedError(f"unexpected inference input '{unknown}' for model '{model.model}'")
    missing = [name for name, rule in model.inputs.items() if not rule.optional and name not in counts]
    if missing:
        raise RequestRefusedError(
            f"expected {len(model.inputs)} inputs but got {len(inputs)} inputs for model "
            f"'{model.model}'. Got input(s) {_quoted(counts)}, but missing required input(s) "
            f"{_quoted(missing)}. Please provide all required input(s)."
        )


def _check_batch(model: ModelSignature, inputs: Sequence[CarriedInput]) -> None:
    """One batch size for all inputs, up to ``max_batch_size`` (Triton reads the last input first)."""
    batch = None
    for carried in reversed(inputs):
        if not carried.shape:
            raise RequestRefusedError(
                f"input '{carried.name}' has no shape but model requires batch dimension for '{model.model}'"
            )
        if batch is None:
            batch = carried.shape[0]
        elif carried.shape[0] != batch:
            raise RequestRefusedError(
                f"input '{carried.name}' batch size does not match other inputs for '{model.model}'"
            )
    if batch is not None and batch > model.max_batch_size:
        raise RequestRefusedError(
            f"input '{inputs[-1].name}' declares a batch of {batch}: inference request batch-size must "
            f"be <= {model.max_batch_size} for '{model.model}'"
        )


def _outside(model: ModelSignature, carried: CarriedInput, why: str) -> RequestRefusedError:
    return RequestRefusedError(
        f"input '{carried.name}' for model '{model.model}' has shape {_listed(carried.shape)}, outside "
        f"what its config allows: {model.allowed(carried.name)} ({why})"
    )


def _check_shape(model: ModelSignature, carried: CarriedInput) -> None:
    rule = model.inputs[carried.name]
    if carried.datatype != rule.datatype:
        raise RequestRefusedError(
            f"inference input '{carried.name}' data-type is '{carried.datatype}', but model "
            f"'{model.model}' expects '{rule.datatype}'"
        )
    dims = carried.shape[1:] if model.batched else carried.shape
    if len(dims) != len(rule.fixed) or any(f != -1 and d != f for d, f in zip(dims, rule.fixed, strict=True)):
        expected = [-1, *rule.fixed] if model.batched else list(rule.fixed)
        raise RequestRefusedError(
            f"unexpected shape for input '{carried.name}' for model '{model.model}'. Expected "
            f"{_listed(expected)}, got {_listed(carried.shape)}."
        )
    if model.batched and carried.shape[0] < 1:
        raise _outside(model, carried, "a batch of at least 1")
    for dim, (low, high), fixed in zip(dims, rule.bounds, rule.fixed, strict=True):
        if fixed != -1:
            continue
        if dim < low:
            raise _outside(
                model, carried, f"a dimension may be 0 only where the config's {MIN_SHAPES_PARAMETER} says so"
            )
        if dim > high and rule.declared_max is not None:
            excess = beyond_max_shape(carried.name, list(carried.shape), rule.declared_max)
            if excess and model.batched:
                raise RequestRefusedError(excess)
            raise _outside(model, carried, "its input_max_shapes")
        if dim > high:
            limit = model.body_limit
            raise _outside(model, carried, f"a -1 dim without input_max_shapes: what fits in {limit} bytes")


def _check_size(model: ModelSignature, carried: CarriedInput) -> None:
    """What carries the input holds exactly what its shape needs."""
    elements = math.prod(carried.shape)
    where = f"input '{carried.name}' for model '{model.model}'"
    if carried.carrier in (Carrier.JSON, Carrier.TYPED):  # it counts values, not bytes
        if carried.size != elements:
            raise RequestRefusedError(
                f"{where}: {carried.carrier.value} hold {carried.size} values but shape "
                f"{_listed(carried.shape)} needs {elements}"
            )
        return
    if carried.datatype != "BYTES":
        expected = elements * element_bytes(carried.datatype)
        if carried.size != expected:
            raise RequestRefusedError(
                f"input byte size mismatch for input '{carried.name}' for model '{model.model}'. "
                f"Expected {expected}, got {carried.size}"
            )
        return
    if carried.payload is None:  # a range not read: at least each element's length prefix
        if carried.size < 4 * elements:
            raise RequestRefusedError(
                f"{where}: {carried.carrier.value} holds {carried.size} bytes, too few for the length "
                f"prefixes of {elements} BYTES elements"
            )
        return
    found, walked = count_bytes_elements(carried.payload, elements)
    if found != elements:
        raise RequestRefusedError(
            f"expected {elements} string elements for inference input '{carried.name}' for model "
            f"'{model.model}', got {found}"
        )
    if walked != len(carried.payload):
        raise RequestRefusedError(
            f"{where}: {carried.carrier.value} holds {len(carried.payload) - walked} bytes after the "
            f"{elements} BYTES elements its shape needs"
        )


def check_region_bytes(
    model: ModelSignature, name: str, datatype: str, shape: Sequence[int], payload: bytes | memoryview
) -> None:
    """The bytes read from a client's range for a checked input, walked as any carried bytes."""
    size = len(payload)
    _check_size(model, CarriedInput(name, datatype, tuple(shape), Carrier.SHARED_MEMORY, size, payload))


def _check_outputs(model: ModelSignature, outputs: Sequence[str]) -> None:
    counts = Counter(outputs)
    for name, count in counts.items():
        if name not in model.outputs:
            raise RequestRefusedError(f"unexpected inference output '{name}' for model '{model.model}'")
        if count > 1:
            raise RequestRefusedError(
                f"output '{name}' of model '{model.model}' is requested {count} times; ask for it once"
            )


def check_allowed(model: ModelSignature, inputs: Sequence[CarriedInput], outputs: Sequence[str]) -> None:
    """``RequestRefusedError`` unless ``model``'s config accepts the request (Triton's check order)."""
    for carried in inputs:
        check_dims_fit_int64(carried.name, carried.shape, element_bytes(carried.datatype))
    _check_names(model, inputs)
    if model.batched:
        _check_batch(model, inputs)
    for carried in inputs:
        _check_shape(model, carried)
    for carried in inputs:
        _check_size(model, carried)
    _check_outputs(model, outputs)


def raw_request_input(model: ModelSignature, size: int) -> CarriedInput:
    """The one input of Triton's raw binary request, shaped as Triton deduces it, or its refusal."""
    if len(model.inputs) != 1:
        raise RequestRefusedError(
            f"Raw request must only have 1 input (found 1) to be deduced but got {len(model.inputs)} "
            f"inputs in '{model.model}' model configuration"
        )
    [(name, rule)] = model.inputs.items()
    if rule.fixed.count(-1) > 1:
        raise RequestRefusedError(
            f"The shape of the raw input '{name}' can not be deduced because there are more than one "
            "variable-sized dimension"
        )
    shape = [1] if model.batched else []
    if rule.datatype == "BYTES":
        if rule.fixed.count(-1) or math.prod(rule.fixed) != 1:
            raise RequestRefusedError(
                f"For BYTE datatype raw input '{name}', the model must have input shape [1]"
            )
        # one element whatever the size: Triton prepends its length prefix itself
        return CarriedInput(name, "BYTES", (*shape, *rule.fixed), Carrier.RAW, size + 4)
    elements = size // element_bytes(rule.datatype)
    return CarriedInput(name, rule.datatype, (*shape, *_filled(rule, elements)), Carrier.RAW, size)


def _filled(rule: InputRule, elements: int) -> list[int]:
    """The config's dims with its one ``-1`` dim as long as ``elements`` make it (Triton's deduction)."""
    fixed = math.prod(d for d in rule.fixed if d != -1)
    return [elements // max(fixed, 1) if d == -1 else d for d in rule.fixed]


def generate_input(model: ModelSignature, name: str, values: int) -> CarriedInput:
    """An input of a generate request, shaped as Triton shapes it, or Triton's refusal."""
    rule = model.inputs[name]
    shape = (*([1] if model.batched else []), *_filled(rule, values))
    if rule.fixed.count(-1) > 1 or math.prod(shape) != values:
        raise RequestRefusedError(f"The schema can not convert input '{name}' to tensor with proper shape")
    return CarriedInput(name, rule.datatype, shape, Carrier.JSON, values)
