"""Typed Triton model configs whose field names match ``model_config.proto``: validated in
``__post_init__`` (naming the field), parsed with ``json_format.ParseDict`` into
``model_config_pb2.ModelConfig`` (a misspelt field fails at build time), written with ``text_format``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from exporters.errors import SpecError
from python_backend.atomic_files import write_text


def _check_name(owner: str, name: str) -> None:
    if not name:
        raise SpecError(f"{owner}.name", "must not be empty")


@dataclass
class ModelTensor:
    """An ``input`` or ``output`` entry; ``dims`` exclude the batch dimension when batching is on."""

    name: str
    data_type: str
    dims: list[int]

    def __post_init__(self) -> None:
        _check_name("tensor", self.name)
        if self.data_type not in model_config_pb2.DataType.keys():  # noqa: SIM118 (proto enum wrapper)
            raise SpecError(f"{self.name}.data_type", f"unknown data type {self.data_type!r}")
        if not self.dims or any(d == 0 or d < -1 for d in self.dims):
            raise SpecError(f"{self.name}.dims", f"must be positive or -1, got {self.dims}")


@dataclass
class ModelInput(ModelTensor):
    """An ``input`` with the fields outputs lack: one a request may leave out (``optional``), one the
    batcher may merge across lengths (``allow_ragged_batch``)."""

    optional: bool = False
    allow_ragged_batch: bool = False


@dataclass
class InstanceGroup:
    """One ``instance_group`` entry: ``count`` instances of ``kind`` (on each GPU in ``gpus``)."""

    kind: str
    count: int = 1
    gpus: list[int] = field(default_factory=list)
    name: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ("KIND_CPU", "KIND_GPU", "KIND_MODEL", "KIND_AUTO"):
            raise SpecError("instance_group.kind", f"unknown kind {self.kind!r}")
        if self.count < 1:
            raise SpecError("instance_group.count", f"must be >= 1, got {self.count}")
        if self.kind == "KIND_CPU" and self.gpus:
            raise SpecError("instance_group.gpus", "KIND_CPU instances cannot name GPUs")


@dataclass
class ModelQueuePolicy:
    timeout_action: str = "REJECT"
    default_timeout_microseconds: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0

    def __post_init__(self) -> None:
        if self.timeout_action not in ("REJECT", "DELAY"):
            raise SpecError(
                "default_queue_policy.timeout_action", f"must be REJECT or DELAY, got {self.timeout_action!r}"
            )
        if self.max_queue_size < 0 or self.default_timeout_microseconds < 0:
            raise SpecError(
                "default_queue_policy", "max_queue_size and default_timeout_microseconds must be >= 0"
            )


@dataclass
class ModelDynamicBatching:
    preferred_batch_size: list[int] = field(default_factory=list)
    max_queue_delay_microseconds: int = 0
    default_queue_policy: ModelQueuePolicy | None = None

    def __post_init__(self) -> None:
        if self.max_queue_delay_microseconds < 0:
            raise SpecError("dynamic_batching.max_queue_delay_microseconds", "must be >= 0")


@dataclass
class WarmupInput:
    data_type: str
    dims: list[int]
    zero_data: bool = False
    random_data: bool = False


@dataclass
class ModelWarmup:
    name: str
    batch_size: int
    inputs: dict[str, WarmupInput]
    count: int = 1


@dataclass
class EnsembleStep:
    model_name: str
    model_version: int = -1
    input_map: dict[str, str] = field(default_factory=dict)
    output_map: dict[str, str] = field(default_factory=dict)


@dataclass
class ModelConfig:
    """The subset of ``ModelConfig`` this project writes; names and nesting follow the proto."""

    name: str
    max_batch_size: int
    input: list[ModelTensor]
    output: list[ModelTensor]
    backend: str = ""
    platform: str = ""
    instance_group: list[InstanceGroup] = field(default_factory=list)
    dynamic_batching: ModelDynamicBatching | None = None
    model_warmup: list[ModelWarmup] = field(default_factory=list)
    parameters: dict[str, str] = field(default_factory=dict)
    gpu_execution_accelerator: list[dict[str, Any]] = field(default_factory=list)
    ensemble_steps: list[EnsembleStep] = field(default_factory=list)

    def __post_init__(self) -> None:
        _check_name("model", self.name)
        if self.max_batch_size < 0:
            raise SpecError(f"{self.name}.max_batch_size", f"must be >= 0, got {self.max_batch_size}")
        if bool(self.backend) == bool(self.platform):
            raise SpecError(f"{self.name}.backend", "exactly one of backend and platform must be set")
        batcher = self.dynamic_batching
        if batcher is not None:
            if self.max_batch_size == 0:
                raise SpecError(f"{self.name}.dynamic_batching", "needs max_batch_size >= 1")
            for size in batcher.preferred_batch_size:
                if not 1 <= size <= self.max_batch_size:
                    raise SpecError(
                        f"{self.name}.dynamic_batching.preferred_batch_size",
                        f"{size} is outside 1..max_batch_size ({self.max_batch_size})",
                    )
        for warmup in self.model_warmup:
            if not 1 <= warmup.batch_size <= max(self.max_batch_size, 1):
                raise SpecError(
                    f"{self.name}.model_warmup.batch_size", f"{warmup.batch_size} exceeds max_batch_size"
                )

    def to_dict(self) -> dict[str, Any]:
        """The proto's JSON form; empty sections are left out (parameters keep empty values)."""
        data = dataclasses.asdict(self)
        accelerators = data.pop("gpu_execution_accelerator")
        data["optimization"] = {"execution_accelerators": {"gpu_execution_accelerator": accelerators}}
        data["ensemble_scheduling"] = {"step": data.pop("ensemble_steps")}
        data = _without_unset(data)
        if self.parameters:
            data["parameters"] = {k: {"string_value": v} for k, v in self.parameters.items()}
        return data

    def to_proto(self) -> model_config_pb2.ModelConfig:
        try:
            return json_format.ParseDict(self.to_dict(), model_config_pb2.ModelConfig())
        except json_format.ParseError as error:
            raise SpecError(self.name, f"config does not fit model_config.proto: {error}") from error


def _without_unset(value: Any) -> Any:
    """``value`` without None, False or empty entries: proto3 leaves them unset, and a warm-up input's
    ``zero_data``/``random_data`` are a oneof, of which only the chosen one may appear."""
    if isinstance(value, list):
        return [_without_unset(v) for v in value]
    if not isinstance(value, dict):
        return value
    items = ((k, _without_unset(v)) for k, v in value.items())
    return {k: v for k, v in items if v is not None and v is not False and v not in ("", [], {})}


def write_config(config: ModelConfig, model_dir: Path) -> Path:
    """Write ``config.pbtxt`` through the schema (whole or not at all: Triton may read it any time)."""
    path = model_dir / "config.pbtxt"
    write_text(path, text_format.MessageToString(config.to_proto()))
    return path


def read_config(path: Path) -> model_config_pb2.ModelConfig:
    """Parse a ``config.pbtxt`` with the protobuf schema (fails on any unknown field)."""
    return text_format.Parse(Path(path).read_text(), model_config_pb2.ModelConfig())
