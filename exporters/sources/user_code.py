"""Import the user's code named in the spec (``"package.module:name"``), with an optional folder on
``sys.path``; every failure is a ``SpecError`` naming the model and the field."""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path
from typing import Any

from exporters.errors import SpecError


def import_object(reference: str, path: str | None, field: str) -> Any:
    """The object ``module:name`` refers to, importing ``module`` with ``path`` first on ``sys.path``."""
    module_name, _, name = reference.partition(":")
    if path is not None:
        if not Path(path).is_dir():
            raise SpecError(f"{field}", f"path {path} is not a folder")
        if path not in sys.path:
            sys.path.insert(0, path)
        _forget_other_copies(module_name.split(".")[0], Path(path))
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # the user's module may raise anything while importing
        raise SpecError(field, f"cannot import {module_name!r}: {type(error).__name__}: {error}") from error
    try:
        return getattr(module, name)
    except AttributeError as error:
        raise SpecError(field, f"module {module_name!r} has no {name!r}") from error


def check_sampler_signature(function: Any, reference: str, field: str) -> None:
    """A ``SpecError`` naming ``field`` unless ``function`` can be called as ``function(batch, rng)``."""
    name = reference.partition(":")[2]
    if not callable(function):
        raise SpecError(field, f"{reference} is not a function; define def {name}(batch, rng)")
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # a builtin without a signature: only a call can tell
        return
    try:
        signature.bind(2, None)
    except TypeError as error:
        raise SpecError(
            field,
            f"{reference}({', '.join(signature.parameters)}) cannot be called as {name}(batch, rng) "
            f"({error}); define it as "
            f"def {name}(batch: int, rng: numpy.random.Generator) returning arrays by input name",
        ) from error


def call_sampler(function: Any, reference: str, field: str, batch: int, rng: Any) -> Any:
    """``function(batch, rng)``; a failure is a one-line ``SpecError`` naming ``field``."""
    check_sampler_signature(function, reference, field)
    try:
        return function(batch, rng)
    except Exception as error:  # the user's function may raise anything
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise SpecError(
            field, f"{reference}(batch={batch}, rng) raised {type(error).__name__}: {first}; fix the function"
        ) from error


def _forget_other_copies(package: str, path: Path) -> None:
    """Drop ``package`` from the import cache when it came from another folder than ``path`` (two specs
    naming the same package), so the spec's own copy is used."""
    cached = sys.modules.get(package)
    origin = getattr(cached, "__file__", None)
    if cached is None or (origin and Path(origin).resolve().is_relative_to(path.resolve())):
        return
    for key in [k for k in sys.modules if k == package or k.startswith(package + ".")]:
        del sys.modules[key]
    importlib.invalidate_caches()


def module_files(reference: str, path: str | None) -> list[Path]:
    """The user's source files a build depends on: every module imported from ``path`` (not every ``.py``
    there: it may hold a venv), else the factory's own file. A module imported from an archive
    (``deps.zip/pkg/mod.py``) counts as the archive, so an edit inside it rebuilds too."""
    if path is None:
        file = getattr(sys.modules.get(reference.partition(":")[0]), "__file__", None)
        on_disk = _on_disk(Path(file)) if file else None
        return [on_disk] if on_disk is not None else []
    root = Path(path).resolve()
    # A relative __file__ names no folder (torch.classes has "_classes.py"): resolved against the working
    # directory, it would pass for the user's whenever the build runs from root (path: .).
    names = {Path(f) for m in list(sys.modules.values()) if (f := getattr(m, "__file__", None))}
    files = {_on_disk(name) for name in names if name.is_absolute()}
    return sorted(f for f in files if f is not None and f.is_relative_to(root))


def _on_disk(name: Path) -> Path | None:
    """``name`` itself, or the archive it lies in (the nearest parent that is a file), resolved."""
    return next((p.resolve() for p in (name, *name.parents) if p.is_file()), None)
