"""``load_source(spec)``: the ``LoadedSource`` for a model of the spec, whatever its source kind; and
``build_torch_model(spec)``: its torch module, the reference the pipeline builder splits."""

from __future__ import annotations

import inspect
from pathlib import Path

import torch
from torch import nn

from exporters.errors import ExportCheckError, SpecError
from exporters.schema.models import MODULE_KINDS, ModelSpec, PythonSource, no_torch_module
from exporters.sources.base import LoadedSource, TorchModuleSource
from exporters.sources.user_code import import_object, module_files
from exporters.zoo import ZOO


def _python(spec: ModelSpec) -> LoadedSource:
    """The user's factory, called with ``options`` after seeding torch (reproducible random weights)."""
    source = spec.source
    assert isinstance(source, PythonSource)
    field = f"{spec.name}.source.python"
    factory = import_object(source.python, source.path, field)
    if not callable(factory):
        raise SpecError(field, f"{source.python} is not callable")
    try:
        inspect.signature(factory).bind(**spec.options)
    except TypeError as error:
        raise SpecError(f"{spec.name}.options", f"{source.python} does not take them: {error}") from error
    except ValueError:
        pass  # no signature to inspect (a builtin); the call below says what is wrong
    torch.manual_seed(spec.seed)
    try:
        module = factory(**spec.options)
    except Exception as error:  # the user's code may raise anything
        raise SpecError(
            field, f"{source.python}(**options) failed: {type(error).__name__}: {error}"
        ) from error
    if not isinstance(module, nn.Module):
        raise SpecError(field, f"{source.python} must return a torch.nn.Module, got {type(module).__name__}")
    return TorchModuleSource(spec, module.eval(), module_files(source.python, source.path))


def load_source(spec: ModelSpec) -> LoadedSource:
    """Load ``spec``'s model (the heavier sources are imported only when used)."""
    kind = spec.source_kind
    if kind == "zoo":
        return TorchModuleSource(spec, ZOO[spec.source].create(spec.options, spec.seed))
    if kind == "python":
        return _python(spec)
    if kind == "onnx":
        from exporters.sources.onnx_file import OnnxModelSource

        return OnnxModelSource(spec, Path(spec.source.onnx), f"{spec.name}.source.onnx")
    if kind == "torch_export":
        from exporters.sources.torch_program import TorchProgramSource

        return TorchProgramSource(spec)
    from exporters.sources.huggingface import load_huggingface

    return load_huggingface(spec)


def build_torch_model(spec: ModelSpec) -> nn.Module:
    """The spec's fp32 torch model (``onnx`` and ``torch_export`` sources have none: refused unloaded)."""
    if spec.source_kind not in MODULE_KINDS:
        raise ExportCheckError(f"{spec.name}: {no_torch_module(spec.source_kind)}")
    return load_source(spec).module  # type: ignore[attr-defined]
