"""Typed dataclasses as the one definition of a YAML schema: fields are the allowed keys, defaults the
defaults, ``Literal`` hints the choices, ``at_least`` metadata the lower bounds. ``check_fields`` (from
every ``__post_init__``) keeps ``dataclasses.replace`` from building an invalid object; ``parse`` builds
one from YAML and prefixes every error with the field's path (``models[1].batching.max_queue_delay_us``).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, Literal, Union, get_args, get_origin

from exporters.errors import SpecError

MIN = "min"  # field metadata: the smallest allowed integer (also for each element of a tuple)
SCALARS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def at_least(minimum: int, default: Any = dataclasses.MISSING) -> Any:
    """A field whose integers (or tuple elements) must be ``>= minimum``."""
    return dataclasses.field(default=default, metadata={MIN: minimum})


@functools.cache
def hints(cls: type) -> dict[str, Any]:
    """The resolved type hints of a dataclass (its annotations are strings under ``__future__``)."""
    return typing.get_type_hints(cls)


def required_names(cls: type) -> tuple[str, ...]:
    missing = dataclasses.MISSING
    return tuple(
        f.name for f in dataclasses.fields(cls) if f.default is missing and f.default_factory is missing
    )


def describe(hint: Any) -> str:
    if get_origin(hint) is Literal:
        return " | ".join(str(v) for v in get_args(hint))
    if get_origin(hint) in (Union, types.UnionType):
        return " or ".join(describe(a) for a in get_args(hint) if a is not type(None))
    if get_origin(hint) is tuple:
        return "a list"
    if dataclasses.is_dataclass(hint):
        return "a mapping"
    return SCALARS.get(hint, getattr(hint, "__name__", str(hint)))


def check_value(value: Any, hint: Any, path: str, minimum: int | None = None, yaml: bool = False) -> Any:
    """``value`` if it fits ``hint`` (and ``minimum`` for integers), else ``SpecError(path, …)``; with
    ``yaml``, YAML data as ``hint`` holds it (lists as tuples, mappings as dataclasses)."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return value
    if origin is Literal:
        if value not in args:
            raise SpecError(path, f"must be one of {', '.join(map(str, args))}; got {value!r}")
    elif origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return value
        records = [a for a in args if dataclasses.is_dataclass(a)]
        if yaml and isinstance(value, dict) and records:
            fitting = [a for a in records if set(required_names(a)) <= set(value)]
            if len(fitting) != 1:
                keys = ", ".join(k for a in records for k in required_names(a))
                raise SpecError(path, f"a mapping here needs one of the keys {keys}; got {sorted(value)}")
            return parse(fitting[0], value, path)
        value = tuple(value) if yaml and isinstance(value, list) else value
        errors = []
        for arm in (a for a in args if a is not type(None)):
            try:
                return check_value(value, arm, path, minimum, yaml)
            except SpecError as error:
                errors.append(error)
        if len(errors) == 1:
            raise errors[0]
        raise SpecError(path, f"must be {describe(hint)}; got {value!r}")
    elif hint in SCALARS:  # a bool is an int to Python, never to a spec unless bool is asked for
        accepted = int | float if hint is float else hint
        if isinstance(value, bool) != (hint is bool) or not isinstance(value, accepted):
            raise SpecError(path, f"must be {SCALARS[hint]}, got {value!r}")
        if hint is int and minimum is not None and value < minimum:
            raise SpecError(path, f"must be >= {minimum}, got {value}")
    elif origin is tuple:
        value = tuple(value) if yaml and isinstance(value, list) else value
        if not isinstance(value, tuple):
            raise SpecError(path, f"must be a list, got {value!r}")
        items = args[:1] * len(value) if len(args) == 2 and args[1] is Ellipsis else args
        if len(items) != len(value):
            raise SpecError(path, f"must be a list of {len(items)} values, got {list(value)!r}")
        pairs = enumerate(zip(value, items, strict=True))
        return tuple(
            check_value(item, item_hint, f"{path}[{i}]", minimum, yaml) for i, (item, item_hint) in pairs
        )
    elif origin is dict:
        if not isinstance(value, dict):
            raise SpecError(path, f"must be a mapping, got {type(value).__name__}")
    elif dataclasses.is_dataclass(hint):
        if yaml and isinstance(value, dict):
            return parse(hint, value, path)
        if not isinstance(value, hint):
            raise SpecError(path, f"must be a mapping, got {type(value).__name__}")
    return value


def check_fields(instance: Any) -> None:
    """Hold every field of a dataclass instance to its type hint and metadata (from ``__post_init__``)."""
    types_ = hints(type(instance))
    for item in dataclasses.fields(instance):
        check_value(getattr(instance, item.name), types_[item.name], item.name, item.metadata.get(MIN))


class Checked:
    """The base of a spec dataclass with no invariant beyond its hints: held to them when built."""

    def __post_init__(self) -> None:
        check_fields(self)


def nested(path: str, error: SpecError) -> SpecError:
    """``error`` (raised by a dataclass about one of its fields) re-addressed below ``path``."""
    return SpecError(f"{path}.{error.path}" if error.path else path, error.problem)


def parse(cls: type, data: Any, path: str, **overrides: Any) -> Any:
    """Build ``cls`` from a YAML mapping, errors under ``path``; ``overrides``: values of keys it left out."""
    if not isinstance(data, dict):
        raise SpecError(path, f"must be a mapping, got {type(data).__name__}")
    allowed = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise SpecError(f"{path}.{unknown[0]}", f"unknown field (allowed: {', '.join(sorted(allowed))})")
    missing = [name for name in required_names(cls) if name not in data and name not in overrides]
    if missing:
        raise SpecError(f"{path}.{missing[0]}", "is required")
    values = {
        f.name: check_value(
            data[f.name], hints(cls)[f.name], f"{path}.{f.name}", f.metadata.get(MIN), yaml=True
        )
        for f in dataclasses.fields(cls)
        if f.name in data
    }
    try:
        return cls(**{**overrides, **values})
    except SpecError as error:
        raise nested(path, error) from None


def to_data(value: Any) -> Any:
    """The YAML form of a spec dataclass (the inverse of ``parse``), ``None`` and defaults left out."""
    if dataclasses.is_dataclass(value):
        data = {}
        for item in dataclasses.fields(value):
            current = getattr(value, item.name)
            default = (
                item.default_factory() if item.default_factory is not dataclasses.MISSING else item.default
            )
            if current is None or (default is not dataclasses.MISSING and current == default):
                continue
            data[item.name] = to_data(current)
        return data
    if isinstance(value, tuple | list):
        return [to_data(v) for v in value]
    if isinstance(value, dict):
        return {k: to_data(v) for k, v in value.items()}
    return value
