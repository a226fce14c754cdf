"""Saved documents (``result.json``, ``plan.json``): dataclasses as JSON, read back through the same types
(pydantic), so a wrong field fails as the file is read, naming it; a key no type has any more is passed
over, so older files still read."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, TypeVar

from pydantic import TypeAdapter, ValidationError

from perf.errors import OptionError
from perf.markdown import plain

Document = TypeVar("Document")


def save_document(path: Path, document: Any) -> Path:
    """The dataclass ``document`` as indented JSON at ``path`` (``asdict`` refuses anything else)."""
    path.write_text(json.dumps(dataclasses.asdict(document), indent=1, default=plain))
    return path


def load_document(path: Path, kind: type[Document], under: str | None = None) -> Document:
    """``path`` read back as ``kind`` (with ``under``: the object under that key, where the file is a
    larger document holding it); an ``OptionError`` naming the file and each field it got wrong."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as error:
        raise OptionError(f"{path}: no such file") from error
    except json.JSONDecodeError as error:
        raise OptionError(f"{path}: not JSON ({error})") from error
    if under is not None and isinstance(data, dict) and under in data:
        data = data[under]
    try:
        return TypeAdapter(kind).validate_python(data)
    except ValidationError as error:
        fields = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}" for e in error.errors()[:5]
        )
        raise OptionError(f"{path}: not a {kind.__name__} document: {fields}") from error
