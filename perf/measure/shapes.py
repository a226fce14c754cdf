"""Shapes as served (docs/PERF.md): the lengths a variable-length model's requests take (``ShapeMix``),
what the client sends for them (``ShapePlan``), buckets and what their padding costs. Triton merges only
requests of equal shapes, so one length for every request makes batching look better than it is."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from exporters.schema.models import ModelSpec
from exporters.schema.sections import INTEGER_DTYPES, VARIABLE
from exporters.sources.inputs import draw_inputs
from perf.markdown import table
from perf.measure.records import Record

SAMPLER_DRAWS = 256  # sampler calls tallied into a ShapeMix when the spec states no ``shapes:``
PLAN_REQUESTS = 4096  # the (true, sent) lengths a plan cycles through
GAP_S = 0.0005  # responses of one shape this close together are counted as one formed batch
PADDING_BATCH = 4  # the batch the padding cost's raw compute is timed at


def has_variable_axis(spec: ModelSpec) -> bool:
    return any(t.variable for t in spec.inputs)


def length_of(spec: ModelSpec, arrays: Sequence[np.ndarray]) -> int:
    """The size of the first variable axis (``draw_inputs`` gives every variable axis one length)."""
    for tensor, array in zip(spec.inputs, arrays, strict=True):
        if tensor.variable:
            return int(array.shape[1 + tensor.shape.index(VARIABLE)])
    return 0


@dataclass(frozen=True)
class ShapeMix:
    """Lengths (ascending, distinct), the share of requests that take each, and where they come from."""

    lengths: tuple[int, ...]
    weights: tuple[float, ...]
    source: str

    def draw(self, count: int, rng: np.random.Generator) -> np.ndarray:
        return rng.choice(np.asarray(self.lengths), size=count, p=np.asarray(self.weights))

    def quantile(self, q: float) -> int:
        """The smallest length at least ``q`` of the requests do not exceed."""
        cumulative = np.cumsum(self.weights)
        index = int(np.searchsorted(cumulative, q - 1e-9))
        return self.lengths[min(index, len(self.lengths) - 1)]

    @property
    def mean(self) -> float:
        return float(np.dot(self.lengths, self.weights))

    @property
    def longest(self) -> int:
        return self.lengths[-1]

    def describe(self) -> str:
        return (
            f"{len(self.lengths)} lengths {self.lengths[0]}-{self.longest} (median {self.quantile(0.5)}, "
            f"mean {self.mean:.0f}) from {self.source}"
        )


def mix_of(lengths: Sequence[int], source: str) -> ShapeMix:
    """The ``ShapeMix`` of observed ``lengths``, each weighted by how often it came."""
    values, counts = np.unique(np.asarray(lengths, dtype=int), return_counts=True)
    return ShapeMix(tuple(int(n) for n in values), tuple(float(c) for c in counts / counts.sum()), source)


def shape_mix(spec: ModelSpec, seed: int = 0, draws: int = SAMPLER_DRAWS) -> ShapeMix:
    """The lengths ``spec``'s requests take: its ``shapes:``, else ``draws`` calls of its sampler."""
    if spec.shapes is not None:
        return ShapeMix(tuple(spec.shapes.lengths), spec.shapes.probabilities, "the spec's shapes:")
    observed = [length_of(spec, draw_inputs(spec, 1, seed + index)) for index in range(draws)]
    if spec.sample is not None:
        source = f"{draws} draws of {spec.sample}"
    elif spec.lengths:
        source = f"the spec's lengths {list(spec.lengths)}"
    else:
        source = f"lengths uniform up to max_shape ({spec.variable_bound})"
    return mix_of(observed, source)


def bucket_of(length: int, buckets: Sequence[int], bound: int) -> int:
    """The length a request is sent at: the smallest bucket that fits it (the axis bound past all)."""
    if not buckets:
        return length
    return next((b for b in sorted(buckets) if b >= length), max(bound, length))


def bucket_candidates(mix: ShapeMix) -> dict[str, tuple[int, ...]]:
    """No buckets, and 2 and 4 buckets at quantiles of the mix, the longest length always one of them."""
    candidates: dict[str, tuple[int, ...]] = {"exact lengths": ()}
    for count in (2, 4):
        edges = tuple(sorted({*(mix.quantile(k / count) for k in range(1, count)), mix.longest}))
        if len(edges) < len(mix.lengths) and edges not in candidates.values():
            candidates[f"{count} buckets"] = edges
    return candidates


def bucket_ways(model: ModelSpec, seed: int = 0) -> dict[str, tuple[int, ...]]:
    """The bucket sets tune, plan and perf measure: the candidates and the spec's own ``buckets:``."""
    ways = bucket_candidates(shape_mix(model, seed))
    if model.buckets and model.buckets not in ways.values():
        ways["the spec's buckets"] = model.buckets
    return ways


def padded_share(mix: ShapeMix, buckets: Sequence[int], bound: int) -> float:
    """The share of sent positions that are padding."""
    sent = sum(w * bucket_of(n, buckets, bound) for n, w in zip(mix.lengths, mix.weights, strict=True))
    return 1.0 - mix.mean / sent if sent else 0.0


def resized(spec: ModelSpec, arrays: dict[str, np.ndarray], length: int) -> dict[str, np.ndarray]:
    """``arrays`` with every variable axis cropped or padded to ``length`` (at most that axis' bound)."""
    out = {}
    for tensor in spec.inputs:
        array = arrays[tensor.name]
        # an integer input named as a mask is padded with zeros: it tells the model what is padding
        mask = tensor.dtype in INTEGER_DTYPES and "mask" in tensor.name.lower()
        for axis, (dim, bound) in enumerate(zip(tensor.shape, tensor.largest, strict=True)):
            if dim != VARIABLE:
                continue
            target, current = min(length, bound), array.shape[axis + 1]
            if target < current:
                array = np.take(array, range(target), axis=axis + 1)
            elif target > current:
                widths = [(0, 0)] * array.ndim
                widths[axis + 1] = (0, target - current)
                array = np.pad(array, widths, mode="constant" if mask else "edge")
        out[tensor.name] = np.ascontiguousarray(array)
    return out


@dataclass(frozen=True)
class ShapePlan:
    """``pools[sent length]`` (rows as in ``Target.inputs``) and each request's (true, sent) length."""

    mix: ShapeMix
    buckets: tuple[int, ...]
    pools: dict[int, dict[str, np.ndarray]]
    requests: tuple[tuple[int, int], ...]

    def describe(self) -> str:
        padded = f", padded to buckets {list(self.buckets)}" if self.buckets else ""
        return f"{self.mix.describe()}{padded}"


def shape_plan(
    spec: ModelSpec, rows: int, seed: int = 0, buckets: Sequence[int] = (), requests: int = PLAN_REQUESTS
) -> ShapePlan:
    """Lengths drawn from ``shape_mix(spec)``, each sent at its bucket; one draw resized per length."""
    mix = shape_mix(spec, seed)
    bound = spec.variable_bound
    true = mix.draw(requests, np.random.default_rng(seed))
    pairs = tuple((int(n), bucket_of(int(n), buckets, bound)) for n in true)
    base = dict(zip((t.name for t in spec.inputs), draw_inputs(spec, rows, seed), strict=True))
    pools = {sent: resized(spec, base, sent) for sent in sorted({s for _, s in pairs})}
    return ShapePlan(mix, tuple(buckets), pools, pairs)


Timer = Callable[[int], float]  # seconds of one batch at a length


def onnx_timer(onnx_path: Path, spec: ModelSpec, batch: int, seed: int = 0, seconds: float = 0.2) -> Timer:
    """Seconds of one batch at a length, in-process onnxruntime with one thread as served."""
    from perf.measure.raw import measure_raw  # onnxruntime: only where a padding cost is measured

    base = dict(zip((t.name for t in spec.inputs), draw_inputs(spec, batch, seed), strict=True))

    def timer(length: int) -> float:
        point = measure_raw(onnx_path, resized(spec, base, length), [batch], seconds=seconds, repeats=3)[0]
        return point.batch_ms / 1e3

    return timer


@dataclass(frozen=True)
class PaddingCost:
    """Raw compute with buckets over without (``ratio`` 1.3: 30% more), the share of sent positions that
    are padding, and the (length, seconds per batch) points timed."""

    buckets: tuple[int, ...]
    ratio: float
    padded_share: float
    timed: tuple[tuple[int, float], ...]


def padding_cost(mix: ShapeMix, buckets: Sequence[int], bound: int, timer: Timer) -> PaddingCost:
    """Σ share·T(sent) / Σ share·T(true), T timed at the buckets and the mix's quartiles, linear between
    (near-linear in length for convolutions, recurrences and MLPs; enough points to show attention)."""
    sent = [bucket_of(n, buckets, bound) for n in mix.lengths]
    points = sorted({mix.lengths[0], *(mix.quantile(q) for q in (0.25, 0.5, 0.75)), mix.longest, *sent})
    timed = tuple((n, timer(n)) for n in points)
    xs, ys = zip(*timed, strict=True)

    def cost(lengths: Sequence[int]) -> float:
        return float(np.dot(np.interp(lengths, xs, ys), mix.weights))

    true_cost = cost(mix.lengths)
    ratio = cost(sent) / true_cost if true_cost > 0 else float("nan")
    return PaddingCost(tuple(buckets), ratio, padded_share(mix, buckets, bound), timed)


@dataclass(frozen=True)
class ShapeRow:
    """The requests sent at one length and the batches they formed as their responses show them: Triton
    counts executions per batch size, not per shape, so the split between lengths comes from the client
    and the total from the server."""

    sent_length: int
    requests: int
    share: float
    shortest: int
    longest: int
    p50_ms: float
    p99_ms: float
    batches: float

    @property
    def mean_batch(self) -> float:
        return self.requests / self.batches if self.batches else 0.0


def formed_batches(recv_s: Sequence[float], max_batch: int) -> int:
    """Responses grouped into batches: a batch's responses leave together (within ``GAP_S``)."""
    batches, size, last = 0, 0, -np.inf
    for at in sorted(recv_s):
        if at - last > GAP_S or size >= max_batch:
            batches, size = batches + 1, 0
        size, last = size + 1, at
    return batches


def shape_rows(records: Sequence[Record], max_batch: int, executions: int = 0) -> list[ShapeRow]:
    """One ``ShapeRow`` per length sent; batches scaled to Triton's ``executions`` where known (not 0)."""
    sized = sorted((r for r in records if r.ok and r.sent_length), key=lambda r: r.sent_length)
    by_length = {n: list(group) for n, group in itertools.groupby(sized, key=lambda r: r.sent_length)}
    grouped = {n: formed_batches([r.recv_s for r in g], max_batch) for n, g in by_length.items()}
    scale = executions / sum(grouped.values()) if executions and grouped else 1.0
    rows = []
    for sent, group in by_length.items():
        p50, p99 = np.percentile(np.concatenate([r.sample_latencies() for r in group]) * 1e3, [50, 99])
        true = [r.length for r in group]
        share = len(group) / len(sized)
        batches = max(1.0, grouped[sent] * scale)
        rows.append(ShapeRow(sent, len(group), share, min(true), max(true), float(p50), float(p99), batches))
    return rows


def shape_table(rows: Sequence[ShapeRow], limit: int = 12) -> list[str]:
    """The per-shape table: the ``limit`` most requested lengths, then one line for the rest."""
    header = ["length sent", "true lengths", "requests", "share", "p50 ms", "p99 ms", "formed batches",
              "mean batch"]  # fmt: skip
    shown = sorted(sorted(rows, key=lambda r: -r.requests)[:limit], key=lambda r: r.sent_length)
    body: list[list[object]] = []
    for r in shown:
        true = f"{r.shortest}" if r.shortest == r.longest else f"{r.shortest}-{r.longest}"
        body.append([r.sent_length, true, r.requests, f"{r.share:.1%}", f"{r.p50_ms:.1f}", f"{r.p99_ms:.1f}",
                     f"{r.batches:.0f}", f"{r.mean_batch:.2f}"])  # fmt: skip
    rest = [r for r in rows if r not in shown]
    if rest:
        requests, batches = sum(r.requests for r in rest), sum(r.batches for r in rest)
        share = sum(r.share for r in rest)
        body.append([f"{len(rest)} more lengths", "", requests, f"{share:.1%}", "", "", f"{batches:.0f}",
                     f"{requests / batches if batches else 0:.2f}"])  # fmt: skip
    return table(header, body).splitlines()
