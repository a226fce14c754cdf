"""``python -m exporters init``: a ready ``models.yaml`` entry read from the user's artifact.

Nobody should type shapes by hand: the ONNX graph and the ``torch.export`` program state their tensors,
a Hugging Face folder its vocabulary, width and longest input, and a factory with a ``sample`` function
shows its inputs (and its outputs, by running it once). The entry is built as a ``ModelSpec``, so it
passes the same checks as the file it will be pasted into.
"""

from __future__ import annotations

import dataclasses
import re
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from exporters.devices import usable_cores
from exporters.errors import SpecError
from exporters.schema.models import HuggingFaceSource, ModelSpec, OnnxSource, PythonSource, TorchExportSource
from exporters.schema.sections import INTEGER_DTYPES, TensorSpec, served_float
from exporters.schema.typed import to_data
from exporters.sources.user_code import call_sampler, import_object
from python_backend.dtypes import DTYPES

# numpy dtype -> spec name, from the one dtype table
DTYPE_NAMES = {d.numpy_dtype(): key for key, d in DTYPES.items() if d.numpy is not None}


def _name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]+", "_", text).strip("_") or "model"


def parse_ranges(texts: list[str] | None) -> dict[str, tuple[int, int]]:
    """``--range NAME=LO:HI`` options as ``{name: (lo, hi)}``: the valid ids ``lo`` to ``hi - 1`` of an
    integer input the artifact does not bound."""
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


def _huggingface_tensors(location: str, max_length: int | None) -> dict[str, Any]:
    from exporters.sources.huggingface import describe, model_folder

    facts = describe(model_folder(location, f"--huggingface {location}"))
    longest = max_length or facts["max_length"]
    ids = {"dtype": "int64", "shape": (-1,), "max_shape": (longest,)}
    return {
        "inputs": (
            TensorSpec("input_ids", range=(0, facts["vocab_size"]), **ids),
            TensorSpec("attention_mask", range=(0, 2), **ids),
        ),
        "outputs": (
            TensorSpec(
                "last_hidden_state", "fp32", (-1, facts["hidden_size"]), (longest, facts["hidden_size"])
            ),
        ),
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
    """The sampler's side: for ``batch`` = 2 (and 3) every array must have the batch as its first axis;
    otherwise the error names the input, its shape and that the sampler is what to change."""
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
    """Inputs from the user's sample function (8 draws, to see which axes vary), outputs from running
    the factory's module on one of them."""
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
    """``inputs`` with the ``--range`` of each integer input named (a sampler draws the ids; served
    requests outside the range get HTTP 400)."""
    integers = [t.name for t in inputs if t.dtype in INTEGER_DTYPES]
    unknown = sorted(set(ranges) - set(integers))
    if unknown:
        raise SpecError("--range", f"{unknown[0]!r} is not an integer input (integer inputs: {integers})")
    return tuple(dataclasses.replace(t, range=ranges[t.name]) if t.name in ranges else t for t in inputs)


def _at_precision(tensors: tuple[TensorSpec, ...], precision: str) -> tuple[TensorSpec, ...]:
    """Float tensors in the model's precision: the sample draws and the module answer in fp32 whatever
    ``--precision`` asks for (the exporter casts the served model and its float inputs)."""
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
    """The ``ModelSpec`` for the artifact at ``location`` (``kind``: onnx, torch_export, huggingface,
    python), checked like any spec entry."""
    if ranges and kind == "huggingface":
        raise SpecError("--range", "a Hugging Face model's ids are its vocabulary's; init reads them")
    if kind == "python":
        source: Any = PythonSource(location, path)
        fields = _python_tensors(source.resolved(Path.cwd()), sample, options or {}, max_length, precision)
        fields["inputs"] = _ranged(fields["inputs"], ranges or {})
        default_name = location.partition(":")[2]
    elif kind == "huggingface":
        source = HuggingFaceSource(location)
        fields = _huggingface_tensors(location, max_length)
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
    """What the defaults leave unused on this machine, as comment lines: one instance with one
    onnxruntime thread runs on one core; more instances serve requests at once, more threads make each
    batch faster. ``make tune`` measures which pays."""
    if cores <= 1:
        return "# this machine has 1 usable core: the defaults (one instance, one thread) use it\n"
    return (
        f"# this machine has {cores} usable cores; the defaults (instances: {{cpu: 1}}, threads:\n"
        f"# {{intra_op: 1}}) use one. Add instances: {{cpu: {cores}}} (requests in parallel) or threads:\n"
        f"# {{intra_op: {cores}}} (each batch faster), or let `make tune` measure which pays.\n"
    )


def entry_yaml(spec: ModelSpec, cores: int | None = None, notes: Sequence[str] = ()) -> str:
    """The entry as YAML under ``models:``, ready to paste (defaults left out), with what the machine's
    ``cores`` (default: this process's usable cores) allow beyond the defaults, and ``notes`` (what
    init found and changed, e.g. ``exporters.init.shapes``) as comments."""
    text = yaml.safe_dump({"models": [to_data(spec)]}, sort_keys=False, default_flow_style=None, width=110)
    header = "# from `python -m exporters init`; paths are relative to the folder of the spec file\n"
    comments = "".join(
        "".join(f"# {line}\n" for line in textwrap.wrap(note, 100, break_on_hyphens=False)) for note in notes
    )
    return header + comments + machine_hint(usable_cores() if cores is None else cores) + text
