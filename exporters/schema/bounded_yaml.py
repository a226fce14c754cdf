"""Read ``models.yaml`` within bounds: YAML aliases repeat their anchor without copying it, so a few
hundred bytes can stand for billions of values ("billion laughs") that the content hash (JSON) would
expand. So the document is measured as expanded right after loading and refused with a ``SpecError``
naming the field that expands, as are recursive aliases, unconvertible numbers, deep nesting, large files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from exporters.errors import SpecError

MAX_SPEC_BYTES = 1 << 20  # a models.yaml is a few KiB; 1 MiB leaves room for long lists of options
MAX_EXPANDED = 1_000_000  # values plus characters, every alias counted as often as it is used


def _children(value: Any) -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        return [(f".{key}", item) for key, item in value.items()]
    if isinstance(value, list):
        return [(f"[{index}]", item) for index, item in enumerate(value)]
    return []


def _expanded_sizes(document: Any) -> dict[int, int]:
    """The expanded size of every container in ``document`` (by ``id``), iteratively (a deep document must
    not exhaust Python's stack); a container met again while open is a recursive alias."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()
    stack: list[tuple[Any, str, bool]] = [(document, "", False)]
    while stack:
        value, path, children_done = stack.pop()
        if not isinstance(value, dict | list):
            continue
        key = id(value)
        if children_done:
            open_.discard(key)
            sizes[key] = 1 + sum(_size(item, sizes) for _, item in _children(value))
            sizes[key] += sum(len(k) for k in value if isinstance(k, str)) if isinstance(value, dict) else 0
            continue
        if key in sizes:
            continue
        if key in open_:
            problem = "refers to itself (a recursive YAML alias); a spec is a tree"
            raise SpecError(path.lstrip(".") or "spec", problem)
        open_.add(key)
        stack.append((value, path, True))
        stack.extend((item, path + step, False) for step, item in _children(value))
    return sizes


def _size(value: Any, sizes: dict[int, int]) -> int:
    if isinstance(value, dict | list):
        return sizes[id(value)]
    return 1 + (len(value) if isinstance(value, str | bytes) else 0)


def _where_it_expands(document: Any, sizes: dict[int, int]) -> str:
    """The field the expansion concentrates in: follow the child holding most of it, down to the
    field whose size is spread over its items (the alias that repeats them)."""
    steps, value = [], document
    while True:
        biggest = max(_children(value), key=lambda child: _size(child[1], sizes), default=None)
        if biggest is None or 2 * _size(biggest[1], sizes) <= _size(value, sizes):
            return "".join(steps).lstrip(".") or "spec"
        steps.append(biggest[0])
        value = biggest[1]


def check_expansion(document: Any, limit: int = MAX_EXPANDED) -> None:
    """``SpecError`` naming the field when ``document``, expanded, holds more than ``limit``."""
    sizes = _expanded_sizes(document)
    total = _size(document, sizes)
    if total > limit:
        field = _where_it_expands(document, sizes)
        raise SpecError(
            field,
            f"expands to {total:,} values and characters, more than a spec may hold ({limit:,}); "
            "YAML aliases (*name) repeat what they point to every time they are used",
        )


def load_spec_document(path: str | Path) -> Any:
    """The YAML document in the spec file at ``path``, read and measured within the bounds above."""
    try:
        with open(path, "rb") as handle:
            text = handle.read(MAX_SPEC_BYTES + 1)
    except OSError as error:
        raise SpecError(str(path), f"cannot read spec: {error}") from error
    if len(text) > MAX_SPEC_BYTES:
        raise SpecError(str(path), f"is larger than {MAX_SPEC_BYTES >> 20} MiB; a spec is a few KiB")
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise SpecError(str(path), f"cannot read spec: {error}") from error
    except RecursionError as error:
        raise SpecError(str(path), "is nested deeper than the YAML parser can follow") from error
    except ValueError as error:  # e.g. an integer with more digits than Python converts
        raise SpecError(str(path), f"holds a value YAML cannot convert: {error}") from error
    check_expansion(document)
    return document
