"""``python -m exporters init``: a ready ``models.yaml`` entry read from the user's artifact (a factory's
from its ``sample`` function and one run), built as a ``ModelSpec`` so it passes the spec's checks, with
the lengths of an ONNX file's variable axes tried as the build tries them."""

from __future__ import annotations

import dataclasses
import re
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from exporters.artifacts.onnx_files import LENGTHS_FIX, ORT_ERRORS, ort_reason, shapes_text
from exporters.devices import usable_cores
from exporters.errors import SpecError
from exporters.schema.models import HuggingFaceSource, ModelSpec, OnnxSource, PythonSource, TorchExportSource
from exporters.schema.sections import INTEGER_DTYPES, VARIABLE, TensorSpec, served_float
from exporters.schema.typed import to_data
from exporters.sources.inputs import draw_inputs
from exporters.sources.user_code import call_sampler, import_object
from python_backend.dtypes import DTYPES

# numpy dtype -> spec name, from the one dtype table
DTYPE_NAMES = {d.numpy_dtype(): key for key, d in DTYPES.items() if d.numpy is not None}


def _name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]+", "_", text).strip("_") or "model"


def parse_ranges(texts: list[str] | None) -> dict[str, tuple[int, int]]:
    """``--range NAME=LO:HI`` options as ``{name: (lo, hi)}`` (valid ids ``lo`` to ``hi - 1``)."""
    ranges = {}
    for text in texts or ():
        name, _, bounds = text.rpartition("=")
        lo, _, hi = bounds.partition(":")
        try:
            ranges[name] = (int(lo), int(hi))
        except ValueError:
            raise SpecError("--range", f"{text!r} is not NAME=LO:HI (e.g. token_ids=0:30522)") from None
        if not name or ranges[name][0] >= ranges[name][1]:
            raise SpecError("--range", f"{text!r}: needs an input name and LO < HI")
    return ranges


def _huggingface_tensors(location: str, max_length: int | None, precision: str) -> dict[str, Any]:
    """Token ids and mask in, the last hidden state out, in the model's float precision (fp16 at fp16)."""
    from exporters.sources.huggingface import describe, model_folder

    facts = describe(model_folder(location, f"--huggingface {location}"))
    longest = max_length or facts["max_length"]
    hidden = facts["hidden_size"]
    ids = {"dtype": "int64", "shape": (-1,), "max_shape": (longest,)}
    states = TensorSpec("last_hidden_state", served_float(precision), (-1, hidden), (longest, hidden))
    return {
        "inputs": (
            TensorSpec("input_ids", range=(0, facts["vocab_size"]), **ids),
            TensorSpec("attention_mask", range=(0, 2), **ids),
        ),
        "outputs": (states,),
    }


def _varying(draws: list[dict[str, Any]], name: str, max_length: int | None) -> dict[str, Any]:
    """One input as the draws show it: axes whose size changes between draws are variable."""
    shapes = [np.asarray(d[name]).shape[1:] for d in draws]
    first = shapes[0]
    varying = [any(s[axis] != first[axis] for s in shapes) for axis in range(len(first))]
    if any(varying) and max_length is None:
        raise SpecError("--max-length", f"input {name!r} varies in length between draws; give its bound")
    return {
        "dtype": DTYPE_NAMES[np.asarray(draws[0][name]).dtype],
        "shape": tuple(-1 if v else d for v, d in zip(varying, first, strict=True)),
        "max_shape": tuple(max_length if v else d for v, d in zip(varying, first, strict=True))
        if any(varying)
        else None,
    }


def _check_batch_axis(sample: str, function: Any, drawn: dict[str, Any]) -> None:
    """At batch 2 (and 3) every array's first axis must be the batch; else the sampler is at fault."""
    again = call_sampler(function, sample, "--sample", 3, np.random.default_rng(0))
    for batch, arrays in ((2, drawn), (3, again if isinstance(again, dict) else {})):
        for name, array in arrays.items():
            shape = list(np.shape(array))
            if not shape or shape[0] != batch:
                raise SpecError(
                    "--sample",
                    f"{sample}(batch={batch}, rng) gives input {name!r} shape {shape}: the first axis must "
                    f"be the batch ({batch}). The sampler's side: return {batch} rows of each input "
                    f"(shape [batch, ...]), as Triton sends a batching model",
                )


def _python_tensors(
    source: PythonSource, sample: str | None, options: dict[str, Any], max_length: int | None, precision: str
) -> dict[str, Any]:
    """Inputs from 8 draws of the sample function (to see which axes vary), outputs from one run."""
    if sample is None:
        raise SpecError(
            "--sample", "a module does not state its input shapes; name a sample function (module:fn)"
        )
    from exporters.artifacts.torch_reference import torch_reference, widen
    from exporters.sources.load import load_source

    function = import_object(sample, source.path, "--sample")
    draws = [call_sampler(function, sample, "--sample", 2, np.random.default_rng(seed)) for seed in range(8)]
    if not all(isinstance(d, dict) for d in draws):
        raise SpecError("--sample", f"{sample} must return a dict of arrays by input name for init")
    _check_batch_axis(sample, function, draws[0])
    inputs = tuple(TensorSpec(name, **_varying(draws, name, max_length)) for name in draws[0])
    probe = ModelSpec(
        "probe", source, 2, _at_precision(inputs, "fp32"), (TensorSpec("probe", "fp32", (1,)),), options,
        sample=sample,
    )  # fmt: skip
    module = load_source(probe).module
    arrays = [widen(np.asarray(a)) for a in draws[0].values()]
    try:
        outputs = torch_reference(module, arrays)
    except Exception as error:  # the user's forward may raise anything
        first = (str(error).strip().splitlines() or [""])[0]
        shapes = ", ".join(f"{name} {list(np.shape(a))}" for name, a in draws[0].items())
        raise SpecError(
            f"--python {source.python}",
            f"the model's forward raised {type(error).__name__} on a batch of 2 from {sample} ({shapes}): "
            f"{first}. The model side: a batching model takes the batch as the first axis of every input "
            "and answers one row per input row; if forward takes one example without a batch axis, give "
            "it one (loop or torch.vmap over the rows inside forward). Models without a batch axis "
            "(Triton's max_batch_size: 0) are not served here",
        ) from error
    names = ["output"] if len(outputs) == 1 else [f"output{k}" for k in range(len(outputs))]
    for name, output in zip(names, outputs, strict=True):
        if output.ndim == 0 or output.shape[0] != 2:
            raise SpecError(
                f"--python {source.python}",
                f"the model has no batch axis: for a batch of 2 from {sample} its {name} has shape "
                f"{list(output.shape)}. The model side: a batching model answers each row (first axis = the "
                "batch); return one row per input row. Models without a batch axis (Triton's "
                "max_batch_size: 0) are not served here",
            )
        if output.ndim == 1:
            raise SpecError(
                f"--python {source.python}",
                f"its {name} is one value per row (shape [batch]); Triton's batching models need an axis "
                "beyond the batch: return shape [batch, 1] (y.unsqueeze(1))",
            )
    out = tuple(TensorSpec(n, DTYPE_NAMES[o.dtype], o.shape[1:]) for n, o in zip(names, outputs, strict=True))
    inputs, out = _at_precision(inputs, precision), _at_precision(out, precision)
    return {"inputs": inputs, "outputs": out, "sample": sample, "options": options}


def _ranged(inputs: tuple[TensorSpec, ...], ranges: dict[str, tuple[int, int]]) -> tuple[TensorSpec, ...]:
    """``inputs`` with the ``--range`` of each integer input named (served ids outside get HTTP 400)."""
    integers = [t.name for t in inputs if t.dtype in INTEGER_DTYPES]
    unknown = sorted(set(ranges) - set(integers))
    if unknown:
        raise SpecError("--range", f"{unknown[0]!r} is not an integer input (integer inputs: {integers})")
    return tuple(dataclasses.replace(t, range=ranges[t.name]) if t.name in ranges else t for t in inputs)


def _at_precision(tensors: tuple[TensorSpec, ...], precision: str) -> tuple[TensorSpec, ...]:
    """Float tensors in the model's precision (the sampler and the module answer in fp32)."""
    return tuple(
        dataclasses.replace(t, dtype=served_float(precision)) if t.dtype in ("fp32", "fp16") else t
        for t in tensors
    )


def init_entry(
    kind: str,
    location: str,
    *,
    name: str | None = None,
    max_batch_size: int = 16,
    max_length: int | None = None,
    precision: str = "fp32",
    sample: str | None = None,
    path: str | None = None,
    options: dict[str, Any] | None = None,
    ranges: dict[str, tuple[int, int]] | None = None,
) -> ModelSpec:
    """The ``ModelSpec`` for the artifact at ``location`` (``kind``: onnx, torch_export, ...)."""
    if ranges and kind == "huggingface":
        raise SpecError("--range", "a Hugging Face model's ids are its vocabulary's; init reads them")
    if kind == "python":
        source: Any = PythonSource(location, path)
        here = PythonSource(location, None if path is None else str(Path(path).resolve()))
        fields = _python_tensors(here, sample, options or {}, max_length, precision)
        fields["inputs"] = _ranged(fields["inputs"], ranges or {})
        default_name = location.partition(":")[2]
    elif kind == "huggingface":
        source = HuggingFaceSource(location)
        fields = _huggingface_tensors(location, max_length, precision)
        default_name = Path(location).name
    else:
        from exporters.sources.signature import artifact_tensors, to_tensor_specs

        source = OnnxSource(location) if kind == "onnx" else TorchExportSource(location)
        where = f"--{kind.replace('_', '-')} {location}"
        inputs, outputs = artifact_tensors(kind, location, where)
        fields = {
            "inputs": to_tensor_specs(inputs, "inputs", precision, where, max_length, ranges or {}),
            "outputs": to_tensor_specs(outputs, "outputs", precision, where, max_length),
        }
        default_name = Path(location).stem
    return ModelSpec(
        name=_name(name or default_name), source=source, max_batch_size=max_batch_size, precision=precision,
        **fields,
    )  # fmt: skip


def machine_hint(cores: int) -> str:
    """What the defaults (one instance, one thread: one core) leave unused here, as comment lines."""
    if cores <= 1:
        return "# this machine has 1 usable core: the defaults (one instance, one thread) use it\n"
    return (
        f"# this machine has {cores} usable cores; the defaults (instances: {{cpu: 1}}, threads:\n"
        f"# {{intra_op: 1}}) use one. Add instances: {{cpu: {cores}}} (requests in parallel) or threads:\n"
        f"# {{intra_op: {cores}}} (each batch faster), or let `make tune` measure which pays.\n"
    )


def entry_yaml(spec: ModelSpec, cores: int | None = None, notes: Sequence[str] = ()) -> str:
    """The entry as YAML under ``models:``, ready to paste; the machine hint and ``notes`` as comments."""
    text = yaml.safe_dump({"models": [to_data(spec)]}, sort_keys=False, default_flow_style=None, width=110)
    header = "# from `python -m exporters init`; paths are relative to the folder of the spec file\n"
    comments = "".join(
        "".join(f"# {line}\n" for line in textwrap.wrap(note, 100, break_on_hyphens=False)) for note in notes
    )
    return header + comments + machine_hint(usable_cores() if cores is None else cores) + text


STRIDES = tuple(2**k for k in range(1, 9))  # 2 … 256: UNet-like models halve up to 5 or 6 times
MAX_LENGTHS = 16  # lengths written at most; more multiples are thinned out evenly


def _with_stride(spec: ModelSpec, stride: int, bound: int) -> ModelSpec:
    """``spec`` with ``lengths:`` and every variable axis' bound at multiples of ``stride``."""
    top = bound // stride * stride
    multiples = list(range(stride, top + 1, stride))
    if len(multiples) > MAX_LENGTHS:
        picks = np.linspace(0, len(multiples) - 1, MAX_LENGTHS).round().astype(int)
        multiples = [multiples[i] for i in sorted(set(picks))]

    def bounded(tensor: TensorSpec) -> TensorSpec:
        if not tensor.variable:
            return tensor
        largest = tuple(
            max(stride, m // stride * stride) if d == VARIABLE else m
            for d, m in zip(tensor.shape, tensor.largest, strict=True)
        )
        return dataclasses.replace(tensor, max_shape=largest)

    return dataclasses.replace(
        spec, inputs=tuple(map(bounded, spec.inputs)), outputs=tuple(map(bounded, spec.outputs)),
        lengths=tuple(multiples),
    )  # fmt: skip


def tried_lengths(spec: ModelSpec, onnx_path: Path, where: str) -> tuple[ModelSpec, str]:
    """``spec`` with lengths the file runs at, and a note for the entry's header ("": unchanged). A file
    whose axes take only some lengths would pass ``init`` and fail the build, so it is run at batch 1 at
    lengths of every parity and the bound; where one fails, ``lengths:`` and ``max_shape`` become
    multiples of the smallest power of two whose multiples all run."""
    bound = spec.variable_bound
    if not bound:
        return spec, ""
    from exporters.artifacts.torch_reference import widen
    from python_backend.onnxruntime.ort_session import open_session  # onnxruntime: only where a file is tried

    # The failures are expected here; the error says what matters.
    session = open_session(str(onnx_path), 0, 0, ["CPUExecutionProvider"], quiet=True)

    def feed(length: int) -> dict[str, np.ndarray]:
        """Inputs at ``length`` as the build runs the file: floats widened (an fp16 spec of an fp32 file)."""
        arrays = draw_inputs(dataclasses.replace(spec, lengths=(length,)), 1, seed=length)
        return {t.name: widen(a) for t, a in zip(spec.inputs, arrays, strict=True)}

    def failure(length: int) -> str | None:
        try:
            session.run(None, feed(length))
        except ORT_ERRORS as error:
            return ort_reason(error)
        return None

    probes = {n for n in (1, 3, 35, bound // 2 + 1, bound - 1, bound) if 1 <= n <= bound}  # odd, even, bound
    failed = {n: why for n in sorted(probes) if (why := failure(n))}
    if not failed:
        return spec, ""
    first = max(failed)  # the failure nearest the bound: the one the warm-up would meet
    why = failed[first]
    shapes = shapes_text(feed(first))
    for stride in STRIDES:
        top = bound // stride * stride
        if top < stride:
            break
        tries = sorted({stride, max(stride, top // 2 // stride * stride), top})
        if all(failure(n) is None for n in tries):
            return _with_stride(spec, stride, bound), (
                f"onnxruntime runs this model only at some lengths ({shapes}: {why}); every multiple of "
                f"{stride} tried ran, so lengths: and max_shape are multiples of {stride}"
            )
    raise SpecError(
        where,
        f"onnxruntime cannot run the model at {shapes} ({why}), nor at every multiple of any power of two "
        f"up to {bound}; {LENGTHS_FIX}",
    )
