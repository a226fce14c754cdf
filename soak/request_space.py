"""The invariant fuzz's request space: each served model's bounds, read through the fronts' own
``ModelSignature`` and the backends' value guards, and the strategies that draw requests around them. A
``Case`` holds only small numbers and names (its data come from ``seed``), so a failing one pastes back."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from hypothesis import strategies as st
from tritonclient.utils import triton_to_np_dtype

from python_backend.batching import TensorInfo, with_value_guards
from server.fronts.allow_list import ModelSignature, protocol_datatype
from server.fronts.tensor_limits import ELEMENT_BYTES
from soak.fuzz_headers import HeaderCase, header_cases

PROTOCOLS = ("http", "grpc", "stream")
CARRIERS = {
    "http": ("json", "binary", "shm"),
    "grpc": ("raw", "typed", "shm"),
    "stream": ("raw", "typed", "shm"),
}
DATATYPES = (*ELEMENT_BYTES, "FP99", "")
PAGE = 4096
HUGE_DIMS = (1 << 31, 1 << 40, 1 << 62, (1 << 63) - 1)
NEGATIVE_DIMS = (-1, -(1 << 63))
# A shape needing more data than this is sent with none (refused from the shape alone; rows 59-60 test
# large valid bodies)
MAX_DATA_BYTES = 2 << 20
MAX_JSON_VALUES = 1 << 15  # a tensor with more values goes as binary data
# A's regions (``soak.fuzz_regions``) by kind: the byte size each is registered with
REGION_BYTES = {"a0": (2 << 20) + 13, "a1": (2 << 20) + 13, "shared": 16 * PAGE}
# what a range may name: A's regions, the case's own, another user's, and a name nobody registered
REGION_KINDS = ("a0", "a1", "shared", "fresh", "theirs", "nosuch")
BYTES_FAULTS = ("past-end", "huge-length", "cut-prefix", "trailing", "one-short")
# a shared-memory range moved (``_range_fault``): by what field, to which values
RANGE_FAULTS = {
    "offset": (3, 4095, PAGE + 1, 1 << 21, 1 << 40, -1),
    "size": (0, 1, 1 << 21, 1 << 40, -1),
    "region": REGION_KINDS,
}
FILE_SIZES = (PAGE, 3 * PAGE + 13, (2 << 20) + PAGE + 13)
REGISTRATION_KEYS = ("own", "own", "own", "theirs", "stub", "missing")
OTHER_UID_ACTIONS = ("", "", "status", "infer")
# what an output in a region asks for besides, one time in three a fault (row 76): drawn with the output
# rather than as a mutation, so that it meets cases valid otherwise (a mutation seldom did)
REGION_OUTPUT_ASKS = {
    "http": ("", "", "", "", "binary", "classification"),
    "grpc": ("", "", "", "", "classification", "classification"),  # gRPC has no binary data
}


@dataclass(frozen=True)
class InputSpace:
    """One input as its config allows it: each dim's ``(low, high)`` and the values the backend accepts."""

    name: str
    datatype: str
    dims: tuple[int, ...]
    bounds: tuple[tuple[int, int], ...]
    optional: bool = False
    value_range: tuple[int, int] | None = None


@dataclass(frozen=True)
class OutputSpace:
    name: str
    datatype: str
    dims: tuple[int, ...]


@dataclass(frozen=True)
class ModelSpace:
    """One served model's request space, from the config Triton serves."""

    name: str
    max_batch_size: int
    inputs: tuple[InputSpace, ...]
    outputs: tuple[OutputSpace, ...]
    deadline_s: float

    @classmethod
    def from_config(
        cls, name: str, config: Mapping[str, Any], body_limit: int, default_deadline_s: float
    ) -> ModelSpace:
        signature = ModelSignature.from_config(name, config, body_limit)
        infos = [
            TensorInfo(rule_name, np.dtype(triton_to_np_dtype(rule.datatype) or np.uint8), rule.fixed)
            for rule_name, rule in signature.inputs.items()
        ]
        guards = with_value_guards(infos, dict(config))  # in input order
        inputs = tuple(
            InputSpace(name_, rule.datatype, rule.fixed, rule.bounds, rule.optional, guard.bounds)
            for (name_, rule), guard in zip(signature.inputs.items(), guards, strict=True)
        )
        outputs = tuple(
            OutputSpace(
                str(item["name"]),
                protocol_datatype(str(item.get("data_type", ""))),
                tuple(int(d) for d in item.get("dims") or ()),
            )
            for item in config.get("output") or []
        )
        deadline = signature.deadline_s or default_deadline_s
        return cls(name, signature.max_batch_size, inputs, outputs, deadline)

    @property
    def batched(self) -> bool:
        return self.max_batch_size > 0

    def variable_axes(self) -> dict[int, tuple[int, int]]:
        """Each variable axis with the bounds every input allows: inputs sharing one are drawn with one
        length (the encoder's ids and mask must agree), so valid requests are not rare."""
        axes: dict[int, tuple[int, int]] = {}
        for space in self.inputs:
            for axis, (dim, (low, high)) in enumerate(zip(space.dims, space.bounds, strict=True)):
                if dim == -1:
                    old_low, old_high = axes.get(axis, (low, high))
                    axes[axis] = (max(old_low, low), min(old_high, high))
        return axes


@dataclass(frozen=True)
class ShmRange:
    """A shared-memory range; ``size`` None: the tensor's own byte size."""

    region: str
    offset: int
    size: int | None = None


@dataclass(frozen=True)
class TensorCase:
    """One input as sent, with its faults."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    carrier: str
    elements: int
    values: str = "valid"
    byte_delta: int = 0
    bytes_fault: str = ""
    shm: ShmRange | None = None


@dataclass(frozen=True)
class OutputCase:
    """One output asked for; with ``shm``, ``binary`` or ``classification`` is a fault (row 76)."""

    name: str
    binary: bool = False
    shm: ShmRange | None = None
    classification: int = 0  # top classes asked for (0: none)

    @property
    def asks_more_than_its_region(self) -> bool:
        """An output in a region that also asks for binary data or a classification: Triton refuses it,
        and so must the fronts, writing nothing into the region (fault matrix row 76)."""
        return self.shm is not None and (self.binary or self.classification > 0)


@dataclass(frozen=True)
class Registration:
    """A region the case registers first, under the name of kind ``fresh``."""

    file_size: int
    offset: int
    byte_size: int
    key: str = "own"


@dataclass(frozen=True)
class Case:
    """One drawn request; ``other_uid``: what the other user does after it."""

    model: str
    protocol: str
    inputs: tuple[TensorCase, ...]
    outputs: tuple[OutputCase, ...] | None
    seed: int
    registration: Registration | None = None
    other_uid: str = ""
    headers: HeaderCase | None = None


def element_size(datatype: str) -> int:
    return ELEMENT_BYTES.get(datatype, 1)


def data_fits(shape: Sequence[int], datatype: str) -> int:
    """The elements a tensor carries: none past ``MAX_DATA_BYTES`` or with a negative dim."""
    if any(d < 0 for d in shape):
        return 0
    elements = math.prod(shape)
    return elements if elements * element_size(datatype) <= MAX_DATA_BYTES else 0


def boundary(low: int, high: int) -> st.SearchStrategy[int]:
    """A value on a bound of ``[low, high]`` or just outside it half the time, inside it otherwise."""
    if low >= high:
        return st.just(low)
    return st.one_of(st.sampled_from((low - 1, low, high, high + 1)), st.integers(low, high))


def _range(draw: st.DrawFn, size: int, registered: bool) -> ShmRange:
    """A range at a region's start, odd offsets, a page in, or ending at the region's end."""
    region = draw(st.sampled_from(("a0", "a1", "shared", "fresh") if registered else ("a0", "a1", "shared")))
    end = max(0, REGION_BYTES.get(region, PAGE) - size)
    return ShmRange(region, draw(st.sampled_from((0, 1, 7, PAGE, end))))


@st.composite
def _outputs(
    draw: st.DrawFn, space: ModelSpace, protocol: str, batch: int | None, registered: bool
) -> tuple[OutputCase, ...] | None:
    if not space.outputs or draw(st.booleans()):
        return None  # every output, as the server sends them
    chosen = []
    for output in space.outputs:
        if draw(st.booleans()):  # left out: hypothesis draws False more often, so most are asked for
            continue
        shm, asks = None, ""
        if draw(st.booleans()):
            elements = max(batch or 1, 1) * math.prod(max(d, 1) for d in output.dims)
            size = elements * element_size(output.datatype)
            shm = replace(_range(draw, size, registered), size=size)
            asks = draw(st.sampled_from(REGION_OUTPUT_ASKS["http" if protocol == "http" else "grpc"]))
        binary = protocol == "http" and draw(st.booleans()) and shm is None
        classification = 3 if asks == "classification" else 0
        chosen.append(OutputCase(output.name, binary or asks == "binary", shm, classification))
    return tuple(chosen)


def _with_shape(tensor: TensorCase, shape: tuple[int, ...]) -> TensorCase:
    elements = data_fits(shape, tensor.datatype)
    carrier = "binary" if tensor.carrier == "json" and elements > MAX_JSON_VALUES else tensor.carrier
    return replace(tensor, shape=shape, elements=elements, carrier=carrier)


def _pick(draw: st.DrawFn, tensors: list[TensorCase]) -> int | None:
    return draw(st.integers(0, len(tensors) - 1)) if tensors else None


def _dim_fault(draw: st.DrawFn, space: ModelSpace, tensors: list[TensorCase], case: dict) -> None:
    """One dim of one input (or the batch of all) set to 0, 1, the bound, one past it, huge or negative."""
    index = _pick(draw, tensors)
    if index is None or not tensors[index].shape:
        return
    tensor = tensors[index]
    axis = draw(st.integers(0, len(tensor.shape) - 1))
    rule = next((s for s in space.inputs if s.name == tensor.name), None)
    config_axis = axis - space.batched
    high = space.max_batch_size if space.batched and axis == 0 else None
    if high is None and rule is not None and 0 <= config_axis < len(rule.bounds):
        high = rule.bounds[config_axis][1]
    values = (0, 1, *HUGE_DIMS, *NEGATIVE_DIMS, *((high, high + 1) if high is not None else ()))
    value = draw(st.sampled_from(values))
    every = space.batched and axis == 0 and draw(st.booleans())  # the batch of every input at once
    for i, other in enumerate(tensors):
        if i == index or (every and len(other.shape) > axis):
            shape = list(other.shape)
            shape[axis] = value
            tensors[i] = _with_shape(other, tuple(shape))


def _rank_fault(draw: st.DrawFn, space: ModelSpace, tensors: list[TensorCase], case: dict) -> None:
    index = _pick(draw, tensors)
    if index is None:
        return
    shape = tensors[index].shape
    how = draw(st.sampled_from(("extra", "fewer", "none")))
    changed = (*shape, 1) if how == "extra" else shape[:-1] if how == "fewer" else ()
    tensors[index] = _with_shape(tensors[index], changed)


def _datatype_fault(draw: st.DrawFn, space: ModelSpace, tensors: list[TensorCase], case: dict) -> None:
    index = _pick(draw, tensors)
    if index is not None:
        datatype = draw(st.sampled_from(DATATYPES))
        tensors[index] = _with_shape(replace(tensors[index], datatype=datatype), tensors[index].shape)


def _bytes_fault(draw: st.DrawFn, space: ModelSpace, tensors: list[TensorCase], case: dict) -> None:
    """Bytes (values, in JSON and typed contents) cut or added; a BYTES input's length prefix broken."""
    index = _pick(draw, tensors)
    if index is None:
        return
    tensor = tensors[index]
    if tensor.datatype == "BYTES" and tensor.carrier in ("binary", "raw", "shm") and draw(st.booleans()):
        tensors[index] = replace(tensor, bytes_fault=draw(st.sampled_from(BYTES_FAULTS)))
        return
    size = element_size(tensor.datatype)
    delta = draw(st.sampled_from((-1, 1, -size, size, -(1 << 40))))  # the last: cut to nothing
    tensors[index] = replace(tensor, byte_delta=delta)


def _values_fault(draw: st.DrawFn, space: ModelSpace, tensors: list[TensorCase], case: dict) -> None:
    index = _pick(draw, tensors)
    if index is not None:
        values = draw(st.sampled_from(("non-finite", "out-of-range", "beyond-datatype")))
        tensors[index] = replace(tensors[index], values=values)


def _names_fault(draw: st.DrawFn, space: ModelSpace, tensors: list[TensorCase], case: dict) -> None:
    how = draw(st.sampled_from(("missing", "unknown", "twice", "renamed")))
    index = _pick(draw, tensors)
    if how == "unknown" or index is None:
        shape = (1, 1) if space.batched else (1,)
        tensors.append(TensorCase("fuzz_unknown", "FP32", shape, tensors[0].carrier if tensors else "raw", 1))
    elif how == "missing":
        del tensors[index]
    elif how == "twice":
        tensors.insert(index, tensors[index])
    else:
        tensors[index] = replace(tensors[index], name=draw(st.sampled_from(("", tensors[index].name + "_"))))


def _outputs_fault(draw: st.DrawFn, space: ModelSpace, tensors: list[TensorCase], case: dict) -> None:
    outputs = list(case["outputs"] or ())
    if outputs and draw(st.booleans()):
        outputs.append(outputs[0])  # asked for twice
    else:
        outputs.append(OutputCase("fuzz_unknown"))
    case["outputs"] = tuple(outputs)


def _model_fault(draw: st.DrawFn, space: ModelSpace, tensors: list[TensorCase], case: dict) -> None:
    case["model"] = draw(st.sampled_from(("fuzz_nosuch_model", space.name + "_")))


def _range_fault(draw: st.DrawFn, space: ModelSpace, tensors: list[TensorCase], case: dict) -> None:
    """A shared-memory range moved: an odd or huge offset, past its end, resized, or in another's region."""
    named = [i for i, t in enumerate(tensors) if t.shm is not None]
    outputs = [o for o in case["outputs"] or () if o.shm is not None]
    if not named and not outputs:
        return
    how = draw(st.sampled_from(tuple(RANGE_FAULTS)))
    fault = {how: draw(st.sampled_from(RANGE_FAULTS[how]))}
    if named and (not outputs or draw(st.booleans())):
        index = draw(st.sampled_from(named))
        shm = tensors[index].shm
        assert shm is not None
        tensors[index] = replace(tensors[index], shm=replace(shm, **fault))
    else:
        output = draw(st.sampled_from(outputs))
        assert output.shm is not None
        changed = replace(output, shm=replace(output.shm, **fault))
        case["outputs"] = tuple(changed if o is output else o for o in case["outputs"])


MUTATIONS = (
    _dim_fault, _dim_fault, _rank_fault, _datatype_fault, _bytes_fault, _bytes_fault, _values_fault,
    _names_fault, _outputs_fault, _model_fault, _range_fault, _range_fault,
)  # fmt: skip


@st.composite
def registrations(draw: st.DrawFn) -> Registration:
    """A region a case registers: odd, page and past-the-end offsets and sizes, and whose file."""
    file_size = draw(st.sampled_from(FILE_SIZES))
    offset = draw(st.sampled_from((0, 0, PAGE, 1, PAGE - 1, PAGE + 1, file_size - 1, file_size, 1 << 40)))
    rest = max(file_size - offset, 0)
    byte_size = draw(st.sampled_from((rest, rest, 0, 1, rest + 1, 1 << 40)))
    return Registration(file_size, offset, byte_size, draw(st.sampled_from(REGISTRATION_KEYS)))


@st.composite
def cases(draw: st.DrawFn, spaces: Sequence[ModelSpace]) -> Case:
    """A ``Case`` for one of ``spaces``: dims on or near a bound half the time, up to two mutations."""
    space = draw(st.sampled_from(spaces))
    protocol = draw(st.sampled_from(PROTOCOLS))
    registration = draw(st.none() | registrations())
    batch = draw(boundary(1, space.max_batch_size)) if space.batched else None
    axes = {axis: draw(boundary(low, high)) for axis, (low, high) in space.variable_axes().items()}
    tensors = []
    for rule in space.inputs:
        if rule.optional and draw(st.booleans()):
            continue
        dims = tuple(axes.get(axis, dim) if dim == -1 else dim for axis, dim in enumerate(rule.dims))
        shape = (batch, *dims) if batch is not None else dims
        elements = data_fits(shape, rule.datatype)
        carrier = draw(st.sampled_from(CARRIERS[protocol]))
        shm = None
        if carrier == "shm":
            size = elements * element_size(rule.datatype) if rule.datatype != "BYTES" else 0
            shm = _range(draw, size, registration is not None)
        tensors.append(_with_shape(TensorCase(rule.name, rule.datatype, shape, carrier, 0, shm=shm), shape))
    case: dict[str, Any] = {
        "model": space.name,
        "outputs": draw(_outputs(space, protocol, batch, registration is not None)),
    }
    for mutation in draw(st.lists(st.sampled_from(MUTATIONS), max_size=2)):
        mutation(draw, space, tensors, case)
    shm_output = any(output.shm is not None for output in case["outputs"] or ())
    return Case(
        model=case["model"],
        protocol=protocol,
        inputs=tuple(tensors),
        outputs=case["outputs"],
        seed=draw(st.integers(0, (1 << 32) - 1)),
        registration=registration,
        other_uid=draw(st.sampled_from(OTHER_UID_ACTIONS)),
        headers=draw(header_cases(protocol, any(t.carrier == "binary" for t in tensors), shm_output)),
    )
