"""The slice of ``triton_python_backend_utils`` our Python-backend models use, for unit tests without a
server, and a loader that imports a model's ``model.py`` the way the stub does (its folder first on
``sys.path``, the fake module in place of Triton's).

The fakes keep the real API's shape where our models' correctness depends on it: a request lists its
inputs through ``inputs()`` (each listing counted, since each is a call into the stub), a ``Tensor``
takes a numpy array or a DLPack capsule, and ``from_dlpack`` refuses a non-contiguous tensor as the real
one does ("Only contiguous DLPack tensors that are stored in C-Order are supported").
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

PYTHON_BACKEND = Path(__file__).resolve().parents[3] / "python_backend"


class FakeTensor:
    """An input tensor as the stub hands it over: a name, numpy or DLPack."""

    def __init__(self, name: str, value: Any) -> None:
        self._name, self.value = name, value

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self.value.numpy() if isinstance(self.value, torch.Tensor) else self.value

    def to_dlpack(self) -> Any:
        value = self.value if isinstance(self.value, torch.Tensor) else torch.from_numpy(self.value)
        return torch.utils.dlpack.to_dlpack(value)


class FakeRequest:
    """A request carrying ``inputs`` (name → numpy array or torch tensor); counts its listings."""

    def __init__(self, inputs: dict[str, Any]) -> None:
        self.tensors = [FakeTensor(name, value) for name, value in inputs.items()]
        self.listings = 0

    def inputs(self) -> list[FakeTensor]:
        self.listings += 1
        return list(self.tensors)


class OutputTensor:
    """A response tensor: what the model handed over, unchanged (numpy, or torch by DLPack)."""

    def __init__(self, name: str, value: Any) -> None:
        self.name, self.value = name, value

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> OutputTensor:
        tensor = torch.utils.dlpack.from_dlpack(capsule)
        if not tensor.is_contiguous():
            raise RuntimeError("DLPack tensor is not contiguous")
        return OutputTensor(name, tensor)


class FakeResponse:
    def __init__(self, output_tensors: list[OutputTensor] | None = None, error: Any = None) -> None:
        self.outputs = {t.name: t.value for t in output_tensors or []}
        self.error = error


class FakeError:
    INVALID_ARG, INTERNAL = "INVALID_ARG", "INTERNAL"

    def __init__(self, message: str, code: str = "INTERNAL") -> None:
        self.message, self.code = message, code


class FakeCounter:
    def __init__(self) -> None:
        self.increments: list[float] = []

    def increment(self, value: float) -> None:
        self.increments.append(value)


class FakeMetricFamily:
    COUNTER = "COUNTER"

    def __init__(self, name: str, description: str, kind: str) -> None:
        self.metrics: dict[str, FakeCounter] = {}

    def Metric(self, labels: dict[str, str]) -> FakeCounter:  # noqa: N802 (Triton's name)
        return self.metrics.setdefault(labels["kind"], FakeCounter())


def _get_input_tensor_by_name(request: FakeRequest, name: str) -> FakeTensor | None:
    """As Triton's: lists every input of the request, then picks one."""
    return next((t for t in request.inputs() if t.name() == name), None)


def _numpy_dtype(triton_type: str) -> np.dtype:
    """``TYPE_FP32`` → ``float32``, ``TYPE_INT64`` → ``int64`` (the types the tests use)."""
    return np.dtype(triton_type.removeprefix("TYPE_").lower().replace("fp", "float"))


def fake_pb_utils() -> types.ModuleType:
    module = types.ModuleType("triton_python_backend_utils")
    module.get_input_tensor_by_name = _get_input_tensor_by_name
    module.Tensor = OutputTensor
    module.InferenceResponse, module.TritonError = FakeResponse, FakeError
    module.TritonModelException = RuntimeError
    module.MetricFamily = FakeMetricFamily
    module.triton_string_to_numpy = lambda name: np.dtype(
        name.removeprefix("TYPE_").lower().replace("fp", "float")
    )
    module.Logger = types.SimpleNamespace(log_warn=lambda message: None)
    return module


def load_model_module(monkeypatch: pytest.MonkeyPatch, folder: str) -> types.ModuleType:
    """``python_backend/<folder>/model.py`` imported as the stub imports it, beside its helpers; the
    caller removes what it added to ``sys.modules`` (see ``backend_model``)."""
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake_pb_utils())
    monkeypatch.syspath_prepend(str(PYTHON_BACKEND))
    monkeypatch.syspath_prepend(str(PYTHON_BACKEND / folder))
    spec = importlib.util.spec_from_file_location(
        f"{folder}_model_under_test", PYTHON_BACKEND / folder / "model.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def forget_modules(before: set[str]) -> None:
    """Drop our backend's modules imported since ``before``: top-level ``batching`` etc. must not leak to
    other tests. Libraries imported meanwhile stay (torch cannot register its ops twice)."""
    for name in set(sys.modules) - before:
        if str(getattr(sys.modules[name], "__file__", "") or "").startswith(str(PYTHON_BACKEND)):
            del sys.modules[name]
