"""The sections ``models:`` and ``text_embeddings:`` entries share: tensors, batching, instances, threads,
shapes; each dataclass is the schema of its YAML mapping (``exporters.schema.typed``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from exporters.errors import SpecError
from exporters.schema.typed import Checked, at_least, check_fields
from python_backend import dtypes

DTYPES = {key: d.triton for key, d in dtypes.DTYPES.items()}  # spec name -> Triton type (one table)
Dtype = Literal[tuple(dtypes.DTYPES)]  # the table's names are the schema's choices
MODEL_DTYPES = dtypes.MODEL_DTYPES  # bf16 only between pipeline stages (compressed boundaries)
INTEGER_DTYPES = dtypes.INTEGER_DTYPES
Precision = Literal["fp32", "fp16", "int8"]
BatchingMode = Literal["none", "static", "dynamic"]
OutputKind = Literal["values", "class_scores", "embedding"]
Target = Literal["auto", "cpu", "gpu"]
VARIABLE = -1  # a variable axis in a shape (bounded by ``max_shape``)


def served_float(precision: str) -> str:
    """The dtype of a model's float tensors: int8 models keep fp32 (the graph quantizes inside)."""
    return "fp16" if precision == "fp16" else "fp32"


MAX_TENSOR_NAME = 256


@dataclass(frozen=True)
class Tolerance:
    """How closely an output must reproduce its fp32 source: ``kind`` picks the defaults
    (``exporters.artifacts.parity``), a limit given here replaces one; ``max_abs`` applies only when given."""

    kind: OutputKind = "values"
    max_abs: float | None = None
    max_rel: float | None = None
    cosine: float | None = None
    top1: float | None = None

    def __post_init__(self) -> None:
        check_fields(self)
        for name in ("max_abs", "max_rel"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise SpecError(name, f"must be > 0, got {value}")
        if self.cosine is not None and not -1.0 < self.cosine <= 1.0:
            raise SpecError("cosine", f"must be in (-1, 1], got {self.cosine}")
        if self.top1 is not None and not 0.0 < self.top1 <= 1.0:
            raise SpecError("top1", f"must be a share of rows in (0, 1], got {self.top1}")


@dataclass(frozen=True)
class TensorSpec:
    """One input or output; ``shape`` excludes the batch axis. ``-1`` marks a variable axis, bounded by
    ``max_shape`` (warm-up and shm sizing need a largest case); ``range: [lo, hi)``: valid integer ids."""

    name: str
    dtype: Dtype
    shape: tuple[int, ...]
    max_shape: tuple[int, ...] | None = None
    range: tuple[int, int] | None = None
    tolerance: Tolerance | None = None

    def __post_init__(self) -> None:
        check_fields(self)
        name = self.name  # served as the model file gives it (``x:0``); logs and YAML would hide the rest
        if not name or len(name) > MAX_TENSOR_NAME or not name.isprintable() or name != name.strip():
            raise SpecError(
                "name",
                f"must be 1 to {MAX_TENSOR_NAME} printable characters without surrounding spaces, got "
                f"{name!r}; write the name the model file gives the tensor (if that is the name, rename "
                "the tensor where the model is exported)",
            )
        if not self.shape:
            raise SpecError(
                "shape",
                "is [] (one value per row, or no batch axis at all); Triton's batching models need an axis "
                "beyond the batch: make the model give [batch, 1] (y.unsqueeze(1)) and write shape: [1]",
            )
        if any(d < 1 and d != VARIABLE for d in self.shape):
            raise SpecError(
                "shape", f"must list positive integers or -1 (no batch dim), got {list(self.shape)}"
            )
        if self.max_shape is not None:
            if len(self.max_shape) != len(self.shape) or any(
                m < 1 or (d != VARIABLE and m != d) for d, m in zip(self.shape, self.max_shape, strict=True)
            ):
                raise SpecError(
                    "max_shape",
                    f"must have shape's length, a bound >= 1 at each -1 and shape's value elsewhere; "
                    f"got {list(self.max_shape)} for shape {list(self.shape)}",
                )
        elif self.variable:
            raise SpecError("max_shape", f"is required with a variable axis (shape {list(self.shape)})")
        if self.range is not None:
            if self.dtype not in INTEGER_DTYPES:
                raise SpecError("range", f"is for integer tensors, {self.name} is {self.dtype}")
            if self.range[0] >= self.range[1]:
                raise SpecError("range", f"must be [lo, hi) with lo < hi, got {list(self.range)}")
        if self.tolerance is not None and self.dtype in INTEGER_DTYPES:
            raise SpecError(
                "tolerance",
                f"is for float outputs (integers must match exactly), {self.name} is {self.dtype}",
            )

    @property
    def variable(self) -> bool:
        return VARIABLE in self.shape

    @property
    def largest(self) -> tuple[int, ...]:
        """The shape with every variable axis at its bound (warm-up, memory sizing)."""
        return self.max_shape if self.max_shape is not None else self.shape

    def admits(self, dims: tuple[int, ...]) -> bool:
        """Concrete ``dims`` (no batch axis) fit: fixed axes equal, variable ones within their bound."""
        return len(dims) == len(self.shape) and all(
            (1 <= n <= m) if d == VARIABLE else n == d
            for n, d, m in zip(dims, self.shape, self.largest, strict=True)
        )


@dataclass(frozen=True)
class QueuePolicy(Checked):
    """Bounds the batcher's queue so overload is rejected instead of growing without limit."""

    max_queue_size: int = at_least(0, 0)
    timeout_us: int = at_least(0, 0)
    timeout_action: Literal["reject", "delay"] = "reject"


@dataclass(frozen=True)
class Batching:
    """How requests become batches: ``none``, ``static`` (clients send ``batch_size``) or ``dynamic``
    (Triton's dynamic batcher); limits that need ``max_batch_size`` are in ``check_fits``."""

    mode: BatchingMode = "dynamic"
    max_queue_delay_us: int = at_least(0, 1000)
    preferred_batch_sizes: tuple[int, ...] = at_least(1, ())
    batch_size: int = at_least(0, 0)
    queue: QueuePolicy | None = None

    def __post_init__(self) -> None:
        check_fields(self)
        object.__setattr__(self, "preferred_batch_sizes", tuple(sorted(set(self.preferred_batch_sizes))))
        if self.mode == "static" and self.batch_size < 1:
            raise SpecError("batch_size", "static batching needs batch_size >= 1")
        default_delay = Batching.max_queue_delay_us  # the field's default (a dataclass keeps it on the class)
        if self.mode != "dynamic" and (
            self.preferred_batch_sizes or self.queue is not None or self.max_queue_delay_us != default_delay
        ):
            raise SpecError(
                "mode",
                f"preferred_batch_sizes, max_queue_delay_us and queue need mode: dynamic (is {self.mode})",
            )

    def check_fits(self, max_batch_size: int) -> None:
        """The limits that need the model's ``max_batch_size``, which this section does not hold."""
        for index, size in enumerate(self.preferred_batch_sizes):
            if size > max_batch_size:
                raise SpecError(
                    f"batching.preferred_batch_sizes[{index}]",
                    f"must be in 1..max_batch_size ({max_batch_size}), got {size}",
                )
        if self.mode == "static" and self.batch_size > max_batch_size:
            raise SpecError(
                "batching.batch_size", f"static batching needs 1 <= batch_size <= {max_batch_size}"
            )


@dataclass(frozen=True)
class Instances:
    """``cpu`` instances on CPU targets; ``per_gpu`` instances on each GPU listed in ``gpus`` (or all)."""

    cpu: int = at_least(1, 1)
    per_gpu: int = at_least(1, 1)
    gpus: Literal["all"] | tuple[int, ...] = at_least(0, "all")

    def __post_init__(self) -> None:
        check_fields(self)
        if self.gpus != "all" and (not self.gpus or len(set(self.gpus)) != len(self.gpus)):
            raise SpecError("gpus", f"must be 'all' or a list of distinct GPU indices, got {list(self.gpus)}")


@dataclass(frozen=True)
class Threads(Checked):
    """onnxruntime's thread counts per instance (0: onnxruntime decides)."""

    intra_op: int = at_least(0, 1)
    inter_op: int = at_least(0, 1)


@dataclass(frozen=True)
class Shapes:
    """``shapes: {lengths: [16, 64, 200], weights: [5, 3, 2]}``: the lengths requests take as served, each
    with a probability proportional to its weight (perf, tune and plan; ``perf.measure.shapes``)."""

    lengths: tuple[int, ...] = at_least(1)
    weights: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        check_fields(self)
        if not self.lengths:
            raise SpecError("lengths", "must list at least one length")
        if len(set(self.lengths)) != len(self.lengths):
            raise SpecError("lengths", f"must not repeat a length, got {list(self.lengths)}")
        if self.weights and len(self.weights) != len(self.lengths):
            raise SpecError(
                "weights", f"must give one weight per length ({len(self.lengths)}), got {len(self.weights)}"
            )
        if any(not w > 0 for w in self.weights):
            raise SpecError("weights", f"must all be > 0, got {list(self.weights)}")

    @property
    def probabilities(self) -> tuple[float, ...]:
        weights = self.weights or (1.0,) * len(self.lengths)
        total = float(sum(weights))
        return tuple(float(w) / total for w in weights)
