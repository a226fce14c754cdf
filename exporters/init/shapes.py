"""The lengths ``exporters init`` writes for an ONNX file's variable axes, tried as the build tries them.

The build runs the file at ``max_shape`` (the warm-up) and at lengths drawn from ``lengths:`` (else
uniform up to ``max_shape``), shared by every variable axis. A file whose axes take only some lengths
(``exporters.artifacts.ort_failures``) would pass ``init`` and fail the build. So ``init`` runs the file
first, at batch 1, at the bound and at lengths of every parity (``probe_lengths``). Where all run, the entry
stands. Where one fails, it looks for the stride the axes take: the smallest power of two whose multiples all
run (its smallest, its largest within the bound and one between), and writes ``lengths:`` at multiples of it
and ``max_shape`` at the largest multiple within the bound. Where no stride runs, the error names the
input shape, onnxruntime's reason and what to write.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from exporters.artifacts.ort_failures import LENGTHS_FIX, ORT_ERRORS, ort_reason, shapes_text
from exporters.errors import SpecError
from exporters.schema.models import ModelSpec
from exporters.schema.sections import VARIABLE, TensorSpec
from exporters.sources.inputs import draw_inputs

STRIDES = tuple(2**k for k in range(1, 9))  # 2 … 256: UNet-like models halve up to 5 or 6 times
MAX_LENGTHS = 16  # lengths written at most; more multiples are thinned out evenly


def probe_lengths(bound: int) -> list[int]:
    """Lengths that show whether an axis takes any length: odd and even, short and long, the bound."""
    return sorted({n for n in (1, 3, 35, bound // 2 + 1, bound - 1, bound) if 1 <= n <= bound})


def _with_stride(spec: ModelSpec, stride: int, bound: int) -> ModelSpec:
    """``spec`` with ``lengths:`` at multiples of ``stride`` and every variable axis bounded at the largest
    multiple within its bound."""
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
    """``spec`` with lengths the file runs at, and a note for the entry's header ("": unchanged);
    a ``SpecError`` naming the shape, the reason and the fix where no stride runs."""
    bound = spec.variable_bound
    if not bound:
        return spec, ""
    import onnxruntime as ort  # only where an ONNX file is tried

    options = ort.SessionOptions()
    options.log_severity_level = 4  # the failures are expected here; the error says what matters
    session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])

    def feed(length: int) -> dict[str, np.ndarray]:
        """Batch 1 with every variable axis at ``length``, the inputs drawn as the build draws them."""
        arrays = draw_inputs(dataclasses.replace(spec, lengths=(length,)), 1, seed=length)
        return {t.name: a for t, a in zip(spec.inputs, arrays, strict=True)}

    def failure(length: int) -> str | None:
        """onnxruntime's complaint at ``length``, or None."""
        try:
            session.run(None, feed(length))
        except ORT_ERRORS as error:
            return ort_reason(error)
        return None

    failed = {n: why for n in probe_lengths(bound) if (why := failure(n))}
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
            fixed = _with_stride(spec, stride, bound)
            note = (
                f"onnxruntime runs this model only at some lengths ({shapes}: {why}); every multiple of "
                f"{stride} tried ran, so lengths: and max_shape are multiples of {stride}"
            )
            return fixed, note
    raise SpecError(
        where,
        f"onnxruntime cannot run the model at {shapes} ({why}), nor at every multiple of any power of two "
        f"up to {bound}; {LENGTHS_FIX}",
    )
