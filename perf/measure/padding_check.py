"""Whether padding a request to a bucket leaves the model's answer as it was, checked before buckets
are offered.

A model that masks its padding, pools with a maximum or answers per position gives the same answer
padded; a recurrence or a mean over time does not (the tests' Conv1d+GRU padded from 40 frames to 59
moves by 0.058 on values of 0.21). So the served ONNX file runs a few rows at the traffic's quantile
lengths as they are and padded as a bucket set pads them, each output held to the spec's tolerance
(``exporters.artifacts.parity``); a set is offered only where every output stays within it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from exporters.artifacts.parity import check_outputs
from exporters.schema.models import ModelSpec
from exporters.sources.inputs import draw_inputs
from perf.measure.shapes import ShapeMix, bucket_of, length_of, resized

ROWS = 2  # rows per run: enough to see a difference, cheap at the longest bucket
QUANTILES = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9)  # the traffic's lengths that are padded and compared


@dataclass(frozen=True)
class PaddingVerdict:
    """Whether padding to ``buckets`` keeps every output within tolerance; ``detail`` says what moved."""

    buckets: tuple[int, ...]
    harmless: bool
    detail: str


class PaddingProbe:
    """The served ONNX file in-process (one thread), to compare rows at a length with them padded."""

    def __init__(self, onnx_path: Path, spec: ModelSpec, seed: int = 0) -> None:
        from python_backend.onnxruntime.ort_session import open_session  # only where buckets are judged

        self.session = open_session(str(onnx_path), 1, 1, ["CPUExecutionProvider"])
        self.spec = spec
        self.base = longest_draw(spec, seed)

    def _run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.session.run([t.name for t in self.spec.outputs], feed)

    def compare(self, length: int, padded_to: int) -> tuple[bool, str]:
        """(within tolerance, what the worst output did), padded outputs cropped to the true shape."""
        true = resized(self.spec, self.base, length)
        expected = self._run(true)
        actual = self._run(resized(self.spec, true, padded_to))
        checks = []
        for tensor, want, got in zip(self.spec.outputs, expected, actual, strict=True):
            cropped = got[tuple(slice(0, size) for size in want.shape)]
            checks.append(check_outputs(want, cropped, tensor.tolerance, self.spec.precision, tensor.name))
        worst = max(checks, key=lambda c: (not c.ok, c.max_rel_error))
        words = (
            f"length {length} padded to {padded_to}: {worst.name} moved by up to {worst.max_abs_error:.3g} "
            f"on values up to {worst.scale:.3g} (max rel {worst.max_rel_error:.3g}, the spec's tolerance "
            f"{worst.tolerance.max_rel:g})"
        )
        return all(c.ok for c in checks), words


def longest_draw(spec: ModelSpec, seed: int, draws: int = 16) -> dict[str, np.ndarray]:
    """``ROWS`` rows drawn at the axis bound, or the longest of ``draws`` calls of the spec's sampler:
    shorter lengths are cropped from it."""
    if spec.sample is None:
        spec = dataclasses.replace(spec, lengths=(spec.variable_bound,))
    names = [t.name for t in spec.inputs]
    count = draws if spec.sample is not None else 1
    candidates = [dict(zip(names, draw_inputs(spec, ROWS, seed + k), strict=True)) for k in range(count)]
    return max(candidates, key=lambda arrays: length_of(spec, list(arrays.values())))


def padding_verdict(probe: PaddingProbe, mix: ShapeMix, buckets: Sequence[int], bound: int) -> PaddingVerdict:
    """Pad the mix's quantile lengths as ``buckets`` would; the first that moves beyond tolerance decides."""
    lengths = sorted({mix.quantile(q) if q else mix.lengths[0] for q in QUANTILES})
    pairs = [(n, bucket_of(n, buckets, bound)) for n in lengths]
    pairs = [(n, m) for n, m in pairs if m != n]
    if not pairs:
        return PaddingVerdict(tuple(buckets), True, "no length of the traffic is padded")
    worst = ""
    for length, padded_to in pairs:
        harmless, words = probe.compare(length, padded_to)
        if not harmless:
            return PaddingVerdict(tuple(buckets), False, f"padding changes the answer: {words}")
        worst = worst or words
    return PaddingVerdict(
        tuple(buckets), True, f"{len(pairs)} lengths padded, every output within the tolerance ({worst})"
    )


def offered_ways(
    ways: dict[str, tuple[int, ...]], onnx_path: Path, spec: ModelSpec, mix: ShapeMix, seed: int = 0
) -> tuple[dict[str, tuple[int, ...]], dict[str, PaddingVerdict]]:
    """``ways`` split into those padding leaves harmless (offered) and the others, with their verdicts."""
    probe = PaddingProbe(onnx_path, spec, seed)
    bound = spec.variable_bound
    offered, refused = {}, {}
    for name, buckets in ways.items():
        verdict = padding_verdict(probe, mix, buckets, bound) if buckets else None
        if verdict is None or verdict.harmless:
            offered[name] = buckets
        else:
            refused[name] = verdict
    return offered, refused


def refused_lines(refused: dict[str, PaddingVerdict]) -> list[str]:
    """The report's sentence for bucket sets not offered ([] where none was refused)."""
    if not refused:
        return []
    parts = [f"{name} {list(v.buckets)}: {v.detail}" for name, v in refused.items()]
    return [
        f"Not offered, not measured (padding checked on the served ONNX file, {ROWS} rows at the traffic's "
        "lengths, padded as each set pads, outputs held to the spec's tolerance): " + "; ".join(parts) + "."
    ]
