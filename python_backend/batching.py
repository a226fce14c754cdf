"""Run a list of Triton requests as one batch, and keep one bad request from failing the others.

The Python backend hands ``execute`` a list of requests and does not concatenate them; batching only
pays when the model does. Invariants, relied on by every model here:

* ``len(results) == len(requests)`` and ``results[i]`` answers ``requests[i]``.
* A request whose inputs fail validation gets its own error; the rest still run as one batch.
* If the batched run itself fails (e.g. one request carries an out-of-range id), every request is
  retried alone, so only the culprit gets the error, and every caller gets an answer.
* Value guards (``TensorInfo.finite``, ``TensorInfo.bounds``): Triton checks dtypes and shapes but never
  values, and a NaN or a negative id would otherwise be answered. They run once on the concatenated
  batch (a few vectorised reductions, whatever the number of requests); only when that check fails do
  they run per request, to name the culprits, which fail alone while the rest run as one batch.
  Layout checks (presence, dtype, shape, rows) stay per request: concatenation needs them.
* Outputs are split as views of the batch's arrays (no copy): a row slice of a C-contiguous array is
  C-contiguous, which is all a response tensor needs.

No Triton import, so it is unit-tested without a server. Arrays are numpy by default; the torch stage
runners pass ``concatenate=torch.cat`` and torch dtypes in ``TensorInfo`` so tensors that arrived by
DLPack stay on their device (splitting is plain slicing, which both libraries share).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

Arrays = dict[str, np.ndarray]
RunFn = Callable[[Arrays], Arrays]
ConcatenateFn = Callable[[list], np.ndarray]


class InvalidInputError(ValueError):
    """A request's input is unusable; the message names the input. Maps to INVALID_ARGUMENT / 400."""


class ModelRunError(RuntimeError):
    """The model raised while running one request alone. Maps to INTERNAL / 500."""


@dataclass(frozen=True)
class TensorInfo:
    """What the config promises about one tensor: name, dtype (numpy's or torch's), dims without batch."""

    name: str
    dtype: np.dtype
    dims: tuple[int, ...]
    finite: bool = False  # reject NaN / ±Inf (float inputs)
    bounds: tuple[int, int] | None = None  # integer inputs must lie in [lo, hi)
    max_dims: tuple[int, ...] | None = None  # the largest dims (no batch) a request may have


def config_parameter(config: dict, key: str, default: str = "") -> str:
    """A ``parameters`` entry of a model config (as the backend receives it, JSON): its string value,
    stripped; ``default`` where the config has none."""
    return config.get("parameters", {}).get(key, {}).get("string_value", default).strip()


def error_response(pb_utils: object, error: Exception, prefix: str = "") -> object:
    """The response that answers one request with ``error``: INVALID_ARGUMENT (HTTP 400) for a bad input,
    INTERNAL (500) for the model's own failure (``pb_utils`` passed in, as for ``padding_counters``)."""
    bad_input = isinstance(error, InvalidInputError)
    code = pb_utils.TritonError.INVALID_ARG if bad_input else pb_utils.TritonError.INTERNAL
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"{prefix}{error}", code))


def with_value_guards(inputs: Sequence[TensorInfo], config: dict) -> list[TensorInfo]:
    """``inputs`` with the guards the model config asks for (``ValueError`` names a bad parameter).

    ``allow_non_finite_inputs`` ("true"/"false", default false: NaN/±Inf are rejected) and
    ``input_ranges`` (JSON ``{input: [lo, hi)}``) and ``input_max_shapes`` (JSON ``{input: [dims]}``,
    the bound of each ``-1`` dim) are ``parameters`` entries written by ``exporters.schema.guards``; configs
    without them get the default (finite floats, no ranges, no bounds beyond the config's dims).
    """
    allow = config_parameter(config, "allow_non_finite_inputs", "false").lower()
    if allow not in ("true", "false"):
        raise ValueError(f"parameter allow_non_finite_inputs must be true or false, got {allow!r}")
    text = config_parameter(config, "input_ranges") or "{}"
    try:
        ranges = {name: (int(lo), int(hi)) for name, (lo, hi) in json.loads(text).items()}
    except (ValueError, TypeError, AttributeError) as error:
        raise ValueError(f"parameter input_ranges must map input names to [lo, hi), got {text!r}") from error
    unknown = sorted(set(ranges) - {info.name for info in inputs})
    if unknown:
        raise ValueError(f"parameter input_ranges names no input of the model: {unknown}")
    max_dims = parse_max_shapes(config.get("parameters", {}))
    by_name = {info.name: info for info in inputs}
    for name, dims in max_dims.items():
        if name not in by_name or len(dims) != len(by_name[name].dims):
            raise ValueError(f"parameter input_max_shapes: {name!r} {list(dims)} fits no input of the model")
    return [
        dataclasses.replace(
            info, finite=allow == "false", bounds=ranges.get(info.name), max_dims=max_dims.get(info.name)
        )
        for info in inputs
    ]


def read_inputs(given: dict, names: Sequence[str], convert: Callable) -> Arrays | InvalidInputError:
    """``names`` of a request's inputs (``given``, by name) converted to arrays, or the error naming
    the first missing one (returned, not raised: ``run_batched`` passes it through to that request)."""
    missing = [name for name in names if name not in given]
    if missing:
        return InvalidInputError(f"input '{missing[0]}' is missing")
    return {name: convert(given[name]) for name in names}


def _is_float(array) -> bool:
    return array.dtype.kind == "f" if isinstance(array, np.ndarray) else array.dtype.is_floating_point


def _check_values(array, info: TensorInfo) -> None:
    """The value guards; ``array`` is a numpy array or a torch tensor (both have min/max/isfinite).

    The happy path is one reduction per guard (``all``, ``min``, ``max``); the count in the message is
    taken only once something is wrong."""
    empty = array.size == 0 if isinstance(array, np.ndarray) else array.numel() == 0
    if empty:
        return
    if info.finite and _is_float(array):
        finite = np.isfinite(array) if isinstance(array, np.ndarray) else array.isfinite()
        if not bool(finite.all()):
            raise InvalidInputError(
                f"input '{info.name}' holds {int((~finite).sum())} non-finite value(s) (NaN or Inf); the "
                "model takes finite numbers only"
            )
    if info.bounds is not None:
        low, high = info.bounds
        smallest, largest = int(array.min()), int(array.max())
        if smallest < low or largest >= high:
            culprit = smallest if smallest < low else largest
            raise InvalidInputError(
                f"input '{info.name}' holds {culprit}, outside its declared range [{low}, {high})"
            )


def check_values(arrays: Arrays, inputs: Sequence[TensorInfo]) -> None:
    """The value guards of every input (``InvalidInputError`` names the first bad one). ``arrays`` may
    be one request or a whole concatenated batch: the guards are elementwise, so a batch passes exactly
    when each of its requests does."""
    for info in inputs:
        if info.finite or info.bounds is not None:
            _check_values(arrays[info.name], info)


def parse_max_shapes(parameters: dict) -> dict[str, tuple[int, ...]]:
    """The ``input_max_shapes`` parameter (JSON ``{input: [dims]}``, written by ``exporters.schema.guards``)
    of a config's ``parameters`` (``ValueError`` when it is not that)."""
    text = parameters.get("input_max_shapes", {}).get("string_value", "").strip() or "{}"
    try:
        return {name: tuple(int(d) for d in dims) for name, dims in json.loads(text).items()}
    except (ValueError, TypeError, AttributeError) as error:
        raise ValueError(f"parameter input_max_shapes must map input names to dims, got {text!r}") from error


def beyond_max_shape(name: str, shape: list[int], max_dims: Sequence[int]) -> str | None:
    """Why a request's ``shape`` (batch first) exceeds the input's ``max_dims``, or None: the config's
    ``-1`` dims admit any length, the model promised only its ``max_shape``. One message for the
    backends and the fronts."""
    if len(shape) != len(max_dims) + 1 or all(s <= m for s, m in zip(shape[1:], max_dims, strict=True)):
        return None
    bound = ", ".join(map(str, max_dims))
    return f"input '{name}' has shape {shape}, beyond its max_shape [batch, {bound}]; send at most that"


def check_layout(arrays: Arrays, inputs: Sequence[TensorInfo]) -> int:
    """Check one request's inputs against the config's names, dtypes and shapes (not their values);
    return its batch size (rows). Metadata only: it reads no element."""
    rows = None
    for info in inputs:
        if info.name not in arrays:
            raise InvalidInputError(f"input '{info.name}' is missing")
        array = arrays[info.name]
        if array.dtype != info.dtype:
            raise InvalidInputError(f"input '{info.name}' has dtype {array.dtype}, expected {info.dtype}")
        trailing = tuple(array.shape[1:])
        if trailing != info.dims and (  # the common case is one tuple comparison; -1 dims need a look
            len(trailing) != len(info.dims)
            or any(d not in (-1, t) for d, t in zip(info.dims, trailing, strict=True))
        ):
            raise InvalidInputError(
                f"input '{info.name}' has shape {list(array.shape)}, expected [batch, {info.dims}]"
            )
        if info.max_dims is not None:
            excess = beyond_max_shape(info.name, list(array.shape), info.max_dims)
            if excess:
                raise InvalidInputError(excess)
        if rows is None:
            rows = array.shape[0]
        elif array.shape[0] != rows:
            raise InvalidInputError(
                f"input '{info.name}' has {array.shape[0]} rows, other inputs have {rows}"
            )
    return rows or 0


ANONYMOUS_AXES = ("", "?")  # symbolic sizes that name no axis (onnxruntime shows them as given)


def shared_axes(session_inputs: Sequence) -> dict[str, list[tuple[str, int]]]:
    """The model's named (symbolic) axes that two or more inputs share: ``{axis: [(input, index)]}``.

    An ONNX graph that names an axis alike in two inputs (``sequence`` in ``input_ids`` and
    ``attention_mask``) needs them equal; onnxruntime otherwise fails deep inside the graph with an
    error that blames the server. Read from the model itself, so it holds for any model. An axis named
    ``?`` (or nothing) is anonymous, not shared: exporters such as paddle2onnx write ``?`` for every
    unknown size (``[?, 3, ?, ?]``: batch, height and width need not agree).
    """
    named: dict[str, list[tuple[str, int]]] = {}
    for tensor in session_inputs:
        for index, dim in enumerate(tensor.shape):
            if isinstance(dim, str) and dim.strip() not in ANONYMOUS_AXES:
                named.setdefault(dim, []).append((tensor.name, index))
    return {axis: places for axis, places in named.items() if len(places) > 1}


def check_shared_axes(arrays: dict, axes: dict[str, list[tuple[str, int]]]) -> None:
    """``InvalidInputError`` unless every shared named axis has one size across the inputs."""
    for axis, places in axes.items():
        sizes = {(name, arrays[name].shape[index]) for name, index in places if arrays[name].ndim > index}
        if len({size for _, size in sizes}) > 1:
            described = ", ".join(f"'{name}' {size}" for name, size in sorted(sizes))
            raise InvalidInputError(f"inputs must agree on axis '{axis}': {described}")


def pad_concatenate(arrays: list[np.ndarray]) -> np.ndarray:
    """Concatenate along dim 0 after zero-padding dim 1 to the longest: a ragged batch made dense.

    For token inputs (ids and attention mask) zero is the padding the model masks out; this is what
    "padded to the longest member of the formed batch" costs, the alternative to length buckets.
    """
    longest = max(a.shape[1] for a in arrays)
    if all(a.shape[1] == longest for a in arrays):
        return np.concatenate(arrays)
    rest = [(0, 0)] * (arrays[0].ndim - 2)
    return np.concatenate([np.pad(a, [(0, 0), (0, longest - a.shape[1]), *rest]) for a in arrays])


def _split(outputs: Arrays, sizes: Sequence[int]) -> list[Arrays]:
    """Each request's rows of every output, as views (slices copy nothing)."""
    bounds = [0, *itertools.accumulate(sizes)]
    return [
        {name: array[bounds[i] : bounds[i + 1]] for name, array in outputs.items()} for i in range(len(sizes))
    ]


def _run_alone(run: RunFn, arrays: Arrays) -> Arrays | Exception:
    try:
        return run(arrays)
    except InvalidInputError as error:
        return error
    except Exception as error:  # the model's own failure, reported to this request only
        return ModelRunError(f"{type(error).__name__}: {error}")


def _batch(
    requests: Sequence[Arrays],
    members: Sequence[int],
    inputs: Sequence[TensorInfo],
    concatenate: ConcatenateFn,
) -> Arrays:
    """The members' inputs along dim 0; a single member's arrays as they are (nothing to join)."""
    if len(members) == 1:
        return requests[members[0]]
    return {info.name: concatenate([requests[i][info.name] for i in members]) for info in inputs}


def _value_culprits(
    requests: Sequence[Arrays], members: Sequence[int], inputs: Sequence[TensorInfo]
) -> dict[int, InvalidInputError]:
    """The members whose values fail the guards, each with its own error: run only after the batch's
    check failed, so the per-request cost is paid only when some request is bad."""
    culprits = {}
    for index in members:
        try:
            check_values(requests[index], inputs)
        except InvalidInputError as error:
            culprits[index] = error
    return culprits


def run_batched(
    requests: Sequence[Arrays | Exception],
    inputs: Sequence[TensorInfo],
    run: RunFn,
    concatenate: ConcatenateFn = np.concatenate,
) -> list[Arrays | Exception]:
    """Check layouts, concatenate along dim 0, check values once, run once, split; per-request errors
    stay per request.

    ``requests`` items that are already exceptions (failed to read) pass straight through.
    """
    results: list[Arrays | Exception] = list(requests)
    good: list[int] = []
    sizes: list[int] = []
    for index, arrays in enumerate(requests):
        if isinstance(arrays, Exception):
            continue
        try:
            sizes.append(check_layout(arrays, inputs))
            good.append(index)
        except InvalidInputError as error:
            results[index] = error
    if not good:
        return results
    batch = _batch(requests, good, inputs, concatenate)
    try:
        check_values(batch, inputs)
    except InvalidInputError:
        # Some request is bad (or, with padding, only the padding is out of range: then none is, and
        # the batch runs as it is). Name the culprits; the rest run as one batch without them.
        culprits = _value_culprits(requests, good, inputs)
        if culprits:
            for index, error in culprits.items():
                results[index] = error
            kept = [(i, rows) for i, rows in zip(good, sizes, strict=True) if i not in culprits]
            if not kept:
                return results
            good, sizes = [i for i, _ in kept], [rows for _, rows in kept]
            batch = _batch(requests, good, inputs, concatenate)
    if len(good) == 1:
        results[good[0]] = _run_alone(run, batch)
        return results
    try:
        outputs = run(batch)
    except Exception:
        for index in good:
            results[index] = _run_alone(run, requests[index])
        return results
    total = sum(sizes)
    wrong = {name: int(array.shape[0]) for name, array in outputs.items() if array.shape[0] != total}
    if wrong:  # the split would hand some callers short or empty slices: fail loudly instead
        error = ModelRunError(
            f"the model returned {wrong} rows for a batch of {total}; outputs must keep dim 0"
        )
        for index in good:
            results[index] = error
        return results
    for index, piece in zip(good, _split(outputs, sizes), strict=True):
        results[index] = piece
    return results


@dataclass(frozen=True)
class PaddingCounters:
    """Elements a model received vs computed after padding, as one Triton counter family.

    The family is kept beside its metrics: a Metric outlived by its deleted MetricFamily refuses to count.
    """

    family: object
    real: object
    padded: object


def padding_counters(
    pb_utils: object, name: str, description: str, model: str, padded_kind: str = "padded"
) -> PaddingCounters:
    """The ``{kind="real"}`` and ``{kind=padded_kind}`` counters of ``name`` for ``model`` (``pb_utils`` is
    passed in so this module stays importable without Triton)."""
    family = pb_utils.MetricFamily(name=name, description=description, kind=pb_utils.MetricFamily.COUNTER)
    real = family.Metric(labels={"model": model, "kind": "real"})
    return PaddingCounters(family, real, family.Metric(labels={"model": model, "kind": padded_kind}))
