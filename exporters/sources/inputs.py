"""Example inputs for a model of the spec, drawn in one place for parity checks, ``infer --check`` and perf:
from the user's ``sample:`` function, else the zoo's sampler, else the spec (``range`` for ids, one length
per call shared by every variable axis, so ``input_ids`` and ``attention_mask`` agree)."""

from __future__ import annotations

from typing import Any

import numpy as np

from exporters.errors import SpecError
from exporters.schema.models import ModelSpec, Spec
from exporters.schema.sections import VARIABLE, TensorSpec
from exporters.sources.user_code import call_sampler, check_sampler_signature, import_object
from exporters.zoo import ZOO
from python_backend.dtypes import DTYPES


def _draw_length(spec: ModelSpec, rng: np.random.Generator) -> int:
    if spec.lengths:
        return int(rng.choice(spec.lengths))
    return int(rng.integers(1, spec.variable_bound + 1)) if spec.variable_bound else 1


def _from_spec(tensor: TensorSpec, batch: int, length: int, rng: np.random.Generator) -> np.ndarray:
    shape = (
        batch,
        *(min(length, m) if d == VARIABLE else d for d, m in zip(tensor.shape, tensor.largest, strict=True)),
    )
    if tensor.dtype in ("int64", "int32"):
        low, high = tensor.range if tensor.range is not None else (0, 1)
        return rng.integers(low, high, shape, dtype=DTYPES[tensor.dtype].numpy_dtype())
    return rng.standard_normal(shape, dtype=np.float32)


def check_samplers(spec: Spec) -> None:
    """Every ``sample:`` and ``calibration:`` function imports and takes ``(batch, rng)`` (``validate``)."""
    for model in spec.models:
        for key in ("sample", "calibration"):
            location = getattr(model, key)
            if location:
                field = f"{model.name}.{key}"
                function = import_object(location, getattr(model.source, "path", None), field)
                check_sampler_signature(function, location, field)


def _from_function(
    spec: ModelSpec, batch: int, rng: np.random.Generator, key: str = "sample"
) -> list[np.ndarray]:
    location = getattr(spec, key) or ""
    path = getattr(spec.source, "path", None)
    function = import_object(location, path, f"{spec.name}.{key}")
    result = call_sampler(function, location, f"{spec.name}.{key}", batch, rng)
    names = [t.name for t in spec.inputs]
    if isinstance(result, dict):
        missing = sorted(set(names) - set(result))
        if missing:
            raise SpecError(f"{spec.name}.{key}", f"{location} returned no {missing[0]!r} (inputs: {names})")
        result = [result[name] for name in names]
    if not isinstance(result, list | tuple) or len(result) != len(names):
        raise SpecError(f"{spec.name}.{key}", f"{location} must return {len(names)} arrays ({names})")
    return [np.asarray(array) for array in result]


def check_sample(spec: ModelSpec, arrays: list[np.ndarray], batch: int, what: str) -> None:
    """Each array must fit its input: batch first, fixed axes equal, variable axes within max_shape."""
    for index, (array, tensor) in enumerate(zip(arrays, spec.inputs, strict=True)):
        fits = (
            array.ndim == len(tensor.shape) + 1 and array.shape[0] == batch and tensor.admits(array.shape[1:])
        )
        if not fits:
            raise SpecError(
                f"{spec.name}.inputs[{index}].shape",
                f"{what} gives {tensor.name} shape {list(array.shape)} at batch {batch}; the spec says "
                f"[batch, {', '.join(map(str, tensor.shape))}] (max_shape {list(tensor.largest)})",
            )


def draw_inputs(
    spec: ModelSpec, batch: int, seed: int, model: Any = None, calibration: bool = False
) -> list[np.ndarray]:
    """Valid inputs for ``spec`` at ``batch``, in the spec's dtypes; ``model``: the built zoo model (its
    table sizes), built when not given; ``calibration``: from the ``calibration:`` function first."""
    rng = np.random.default_rng(seed)
    if calibration and spec.calibration is not None:
        arrays = _from_function(spec, batch, rng, "calibration")
        what = f"calibration function {spec.calibration}"
    elif spec.sample is not None:
        arrays, what = _from_function(spec, batch, rng), f"sample function {spec.sample}"
    elif spec.source_kind == "zoo":
        zoo = ZOO[spec.source]
        model = model if model is not None else zoo.create(spec.options, spec.seed)
        arrays, what = zoo.sample(model, spec.options, batch, rng), f"zoo {spec.source}"
    else:
        length = _draw_length(spec, rng)
        arrays, what = [_from_spec(t, batch, length, rng) for t in spec.inputs], "the spec"
    check_sample(spec, arrays, batch, what)
    return [a.astype(DTYPES[t.dtype].numpy_dtype()) for a, t in zip(arrays, spec.inputs, strict=True)]


CALIBRATION_BATCHES = 8  # of CALIBRATION_ROWS rows: 128 examples, ONNX Runtime's usual order of magnitude
CALIBRATION_ROWS = 16
CALIBRATION_SEED = 1000  # seeds apart from the parity checks' (100 + batch), so int8 is checked on new data


def calibration_inputs(spec: ModelSpec, model: Any = None) -> list[list[np.ndarray]]:
    """The batches int8 activation ranges are calibrated on (``draw_inputs(calibration=True)``)."""
    seeds = range(CALIBRATION_SEED, CALIBRATION_SEED + CALIBRATION_BATCHES)
    return [draw_inputs(spec, CALIBRATION_ROWS, seed, model, calibration=True) for seed in seeds]
