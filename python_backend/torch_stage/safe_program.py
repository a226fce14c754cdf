"""Load a ``torch.export`` program (``.pt2``) without ever unpickling: the stage artifact format.

``torch.export.load`` unpickles (``torch.load(weights_only=False)``) in more places than the archive
format advertises: weights or constants flagged ``use_pickle``, custom-object constants, sample inputs
that fail the ``weights_only`` load, and, for backward compatibility, any legacy entry it finds:
``data/weights/<model>.pt``, ``data/constants/<model>.pt`` (preferred over the configs when present) and
a pre-2.8 archive's ``serialized_*.pt`` files. A deny-list misses the next such path, so this is an
allow-list: an archive is loaded only if every entry is one that ``torch.export.save`` writes for a
pickle-free program (``ALLOWED``, plus the ``weight_<n>``/``tensor_<n>`` payloads its configs name as
raw tensor bytes), all under one top folder, each name once, and its sample inputs load with
``weights_only=True``. Anything else is refused, naming the entry, before ``torch.export.load`` runs.

The archive is read with torch's own zip reader, the one that loads it, after ``zip_layout`` has proved
that the raw headers, Python's ``zipfile`` and that reader all see the same entries with the same bytes
(a crafted archive can show each zip reader a different one; fault matrix row 48). The program is then
loaded with ``load_pt2``, torch's reader alone: ``torch.export.load`` would retry a failed archive with
``zipfile`` as a pre-2.8 one and unpickle its ``serialized_*.pt`` entries.

Pickle is not the loader's only way to run code. The program's ``models/model.json`` holds shape
expressions (``expr_str``) that the loader hands to ``sympy.sympify``, which evaluates them as Python
(and many sympy constructors evaluate their own string arguments again): every one must parse with
``shape_expressions``, our own parser over the exact grammar ``torch.export.save`` writes, before
anything is evaluated (fault matrix rows 30 and 47). And the program's ``guards_code`` strings are
Python that ``ExportedProgram.module()`` (by default) and the ONNX exporter execute: they are dropped
from every program loaded here (the callers check input shapes themselves).

The bytes are read once and both checked and loaded from memory, so the file cannot change between
the check and the load. Standard library, sympy and torch only: copied beside each stage's model.py.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.export.pt2_archive._package import load_pt2  # torch's zip reader alone, no zipfile fallback

try:  # beside model.py inside the stub
    from shape_expressions import ShapeExpressionError, parse_shape_expression
    from zip_layout import ZipLayoutError, read_entries
except ImportError:  # imported from the project (the exporters, the tests)
    from python_backend.torch_stage.shape_expressions import ShapeExpressionError, parse_shape_expression
    from python_backend.torch_stage.zip_layout import ZipLayoutError, read_entries

MODEL = "model"  # the program name ``torch.export.save`` writes (and ``torch.export.load`` returns)
WEIGHTS_CONFIG = f"data/weights/{MODEL}_weights_config.json"
CONSTANTS_CONFIG = f"data/constants/{MODEL}_constants_config.json"
SAMPLE_INPUTS = f"data/sample_inputs/{MODEL}.pt"
REQUIRED = ("archive_format", "archive_version", f"models/{MODEL}.json", WEIGHTS_CONFIG, CONSTANTS_CONFIG,
            SAMPLE_INPUTS)  # fmt: skip
ALLOWED = frozenset((*REQUIRED, "byteorder", ".data/version", ".data/serialization_id"))
# Payload files a config may name: raw tensor bytes (``use_pickle`` false) in the config's folder.
PAYLOADS = {WEIGHTS_CONFIG: ("data/weights/", re.compile(r"weight_\d+")),
            CONSTANTS_CONFIG: ("data/constants/", re.compile(r"tensor_\d+"))}  # fmt: skip


class UnsafeArtifactError(ValueError):
    """The ``.pt2`` archive holds something other than a pickle-free program's entries."""


def _entries(names: list[str], where: str) -> dict[str, str]:
    """The archive's entries by their name under its one top folder (``relative -> full name``)."""
    anchor = next((n for n in names if n.endswith("/archive_version")), names[0] if names else "")
    prefix = anchor.split("/", 1)[0] + "/"
    entries: dict[str, str] = {}
    for name in names:
        relative = name.removeprefix(prefix) if name.startswith(prefix) else ""
        if not relative or relative in entries or "\\" in name or ".." in name.split("/"):
            raise UnsafeArtifactError(
                f"{where}: entry {name!r} is not one that torch.export.save writes (outside the archive's "
                "one top folder, or repeated)"
            )
        entries[relative] = name
    return entries


def _payload_names(contents: dict[str, bytes], entries: dict[str, str], where: str) -> set[str]:
    """The payload files the configs name; refused unless every payload is raw tensor bytes."""
    named = set()
    for config_name, (folder, pattern) in PAYLOADS.items():
        try:
            config = json.loads(contents[entries[config_name]]).get("config", {})
        except (ValueError, AttributeError) as error:
            raise UnsafeArtifactError(f"{where}: {config_name} is not a payload config ({error})") from error
        for fqn, payload in config.items():
            payload = payload if isinstance(payload, dict) else {}
            path_name = str(payload.get("path_name", ""))
            if payload.get("use_pickle") is not False or not pattern.fullmatch(path_name):
                raise UnsafeArtifactError(
                    f"{where}: {fqn!r} in {config_name} is stored as {path_name!r} "
                    f"(use_pickle {payload.get('use_pickle')!r}); it would be unpickled"
                )
            if folder + path_name not in entries:
                raise UnsafeArtifactError(f"{where}: {config_name} names {path_name!r}, which is missing")
            named.add(folder + path_name)
    return named


def _symbolic_values(node: Any) -> Iterator[dict]:
    """Every object in the program's JSON holding an ``expr_str`` (a ``SymExpr``: the string the loader
    passes to ``sympy.sympify``, and its ``hint``)."""
    if isinstance(node, dict):
        if "expr_str" in node:
            yield node
        for key, value in node.items():
            if key != "expr_str":
                yield from _symbolic_values(value)
    elif isinstance(node, list):
        for item in node:
            yield from _symbolic_values(item)


def _plain_hint(hint: Any) -> bool:
    """Whether a shape expression's hint is absent or one number (the loader hands it to sympy)."""
    if hint is None:
        return True
    if not isinstance(hint, dict) or len(hint) != 1:
        return False
    kind, value = next(iter(hint.items()))
    return kind in ("as_int", "as_float", "as_bool") and isinstance(value, int | float)


def _check_expressions(text: bytes, name: str, where: str) -> None:
    """Every shape expression parses by ``shape_expressions``' grammar (fault matrix row 47)."""
    try:
        program = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise UnsafeArtifactError(f"{where}: {name} is not JSON ({error})") from error
    for value in _symbolic_values(program):
        expression = value["expr_str"]
        try:
            parse_shape_expression(expression)
            if not _plain_hint(value.get("hint")):
                raise ShapeExpressionError(f"its hint {str(value.get('hint'))[:80]} is not one number")
        except (ShapeExpressionError, RecursionError) as error:
            raise UnsafeArtifactError(
                f"{where}: {name} holds the shape expression {str(expression)[:120]!r}, which is not a "
                f"plain shape expression ({error}); torch.export.load would evaluate it as Python"
            ) from error


def check_archive(data: bytes, where: str) -> dict[str, bytes]:
    """Raise ``UnsafeArtifactError`` unless ``data`` holds only the entries of a pickle-free program;
    returns the entries' bytes as torch's zip reader reads them."""
    try:
        contents = read_entries(data)
    except ZipLayoutError as error:
        raise UnsafeArtifactError(
            f"{where}: not a torch.export archive as torch.export.save lays it out: {error} (zip readers "
            "could disagree on its entries)"
        ) from error
    entries = _entries(list(contents), where)
    missing = [name for name in REQUIRED if name not in entries]
    if missing:
        raise UnsafeArtifactError(f"{where}: no {missing[0]} (a legacy or foreign format)")
    allowed = ALLOWED | _payload_names(contents, entries, where)
    for relative, name in sorted(entries.items()):
        if relative not in allowed:
            raise UnsafeArtifactError(
                f"{where}: entry {name!r} is not one that torch.export.save writes for a pickle-free "
                "program (torch.export.load would unpickle legacy entries); re-export with "
                "torch.export.save"
            )
    _check_expressions(contents[entries[f"models/{MODEL}.json"]], entries[f"models/{MODEL}.json"], where)
    try:
        torch.load(io.BytesIO(contents[entries[SAMPLE_INPUTS]]), weights_only=True)
    except Exception as error:
        raise UnsafeArtifactError(
            f"{where}: sample inputs {entries[SAMPLE_INPUTS]} do not load with weights_only=True"
        ) from error
    return contents


def check_no_pickle(path: str | Path) -> None:
    """Raise ``UnsafeArtifactError`` unless loading ``path`` cannot unpickle anything."""
    check_archive(_read(path), str(path))


def _read(path: str | Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise UnsafeArtifactError(f"{path}: not a torch.export archive ({error})") from error


def read_program_bytes(path: str | Path) -> bytes:
    """The archive's bytes (for ``load_program_bytes``; a caller may also hash them)."""
    return _read(path)


def load_program_bytes(data: bytes, where: str) -> torch.export.ExportedProgram:
    """The program in the very bytes ``check_archive`` accepted (``where`` names them), loaded as
    ``torch.export.load`` loads it but without its fallback to ``zipfile`` and the pre-2.8 format."""
    check_archive(data, where)
    programs = load_pt2(io.BytesIO(data)).exported_programs
    if list(programs) != [MODEL]:
        raise UnsafeArtifactError(f"{where}: holds the programs {sorted(programs)}, not one {MODEL!r}")
    program = programs[MODEL]
    if not hasattr(program, "_guards_code"):  # fail closed if torch moves them where this cannot see
        raise UnsafeArtifactError(
            f"{where}: this torch keeps a program's guard code where it cannot be dropped"
        )
    program._guards_code = []  # code strings from the file: never executed
    return program


def load_exported_program(path: str | Path) -> torch.export.ExportedProgram:
    """The program at ``path``, through ``check_archive``."""
    return load_program_bytes(_read(path), str(path))
