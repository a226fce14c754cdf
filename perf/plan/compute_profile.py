"""A recorded GPU compute profile (``make gpu-check``'s ``compute_profile``, docs/PLAN.md): what a model's
batches cost on a GPU this host does not have, so ``make plan`` on that GPU predicts from its compute."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import ConfigDict

from perf.errors import OptionError
from perf.saved import load_document

Precision = Literal["fp32", "fp16"]


@dataclass(frozen=True)
class PrecisionCompute:
    """One model in one precision on the device: ``T + (N-1)·Δt`` ms and the batches it was fitted to."""

    __pydantic_config__: ClassVar[ConfigDict] = ConfigDict(extra="forbid")

    T_ms: float  # the file's key: the article's T
    dt_ms: float
    batches: dict[int, float]  # batch size -> ms

    def __post_init__(self) -> None:
        if not self.T_ms > 0:
            raise ValueError(f"T_ms must be > 0, got {self.T_ms}")
        if not self.dt_ms >= 0:
            raise ValueError(f"dt_ms must be >= 0, got {self.dt_ms}")
        for size, ms in self.batches.items():
            if size < 1 or not ms > 0:
                raise ValueError(f"batches: batch {size} at {ms} ms (a batch of 1 or more, ms > 0)")


@dataclass(frozen=True)
class ComputeProfile:
    """The recorded profile: the device, what measured it, and per model and precision the fit."""

    __pydantic_config__: ClassVar[ConfigDict] = ConfigDict(extra="forbid")

    device: str
    source: str
    models: dict[str, dict[Precision, PrecisionCompute]]

    def __post_init__(self) -> None:
        if not self.device.strip():
            raise ValueError("device must name the GPU the figures were measured on")
        if not self.models:
            raise ValueError("models is empty: no model's compute was recorded")

    def of(self, model: str, where: str) -> dict[str, PrecisionCompute]:
        """``model``'s figures per precision; an ``OptionError`` naming the models it has otherwise."""
        if model not in self.models:
            raise OptionError(
                f"{where}: no figures for model {model!r} (it has: {', '.join(sorted(self.models))})"
            )
        return dict(self.models[model])


def read_compute_profile(path: Path) -> ComputeProfile:
    """The GPU check's figures file, or its profile alone; an ``OptionError`` naming a wrong field."""
    return load_document(path, ComputeProfile, under="compute_profile")


def plain(gpu: str) -> str:
    return gpu.lower().replace("nvidia", "").replace("tesla", "").strip()


def compute_origin(device: str, recorded: bool, gpus: list[str], here: bool) -> str:
    """Where the compute behind a plan's rates was measured, against the machine planned for, in words a
    reader cannot take for a GPU figure when it is not one."""
    if not gpus:
        return f"from compute measured on {device}"
    named = " + ".join(f"{count}× {name}" for name, count in Counter(gpus).items())  # 4× NVIDIA RTX A6000
    if recorded:  # the same device where it is every GPU named (``NVIDIA H200`` and ``H200`` alike)
        mine, theirs = plain(device), [plain(name) for name in gpus]
        where = f"from the compute profile recorded on {device}"
        return where if all(mine in n or n in mine for n in theirs) else f"{where}, not on the {named} named"
    if here:
        return f"from compute measured on this host's {named}"
    return f"from compute measured on {device}, not on the {named} named"
