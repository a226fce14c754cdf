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

Pickle is not the loader's only way to run code. The program's ``models/model.json`` holds shape
expressions (``expr_str``) that the loader hands to ``sympy.sympify``, which evaluates them as Python;
so every such expression must be a plain sympy constructor call (``Symbol('s0', integer=True)``,
``Add(...)``, ``FloorDiv(...)``: the names in ``SYMPY_NAMES``, constants, shape-symbol names), checked
with ``ast`` before anything is evaluated. And the program's ``guards_code`` strings are Python that
``ExportedProgram.module()`` (by default) and the ONNX exporter execute: they are dropped from every
program loaded here (the callers check input shapes themselves).

The bytes are read once and both checked and loaded from memory, so the file cannot change between
the check and the load. Standard library and torch only: copied beside each stage's model.py.
"""

from __future__ import annotations

import ast
import io
import json
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sympy
import torch
import torch.utils._sympy.functions as torch_sympy

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

# What a program's shape expressions may call or name: sympy's number, arithmetic, relational and logic
# classes and torch's own sympy functions. Nothing that parses a string as code (``S``, ``sympify``).
SYMPY_NAMES = frozenset(
    {
        "Symbol", "Dummy", "Integer", "Rational", "Float", "Add", "Mul", "Pow", "Abs", "floor", "ceiling",
        "Equality", "Unequality", "StrictLessThan", "StrictGreaterThan", "LessThan", "GreaterThan",
        "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "And", "Or", "Not", "BooleanTrue", "BooleanFalse", "true",
        "false", "Half", "One", "Zero", "NegativeOne", "Infinity", "NegativeInfinity", "ComplexInfinity",
        "NaN", "oo", "zoo", "nan", "Piecewise", "ExprCondPair", "Tuple", "IntInfinity",
        "NegativeIntInfinity", "int_oo",
    }
    | {n for n, v in vars(torch_sympy).items() if isinstance(v, type) and issubclass(v, sympy.Basic)}
)  # fmt: skip
PLAIN_NODES = (ast.Expression, ast.keyword, ast.Load, ast.UnaryOp, ast.USub, ast.UAdd)  # besides calls
SHAPE_SYMBOL = re.compile(r"[a-z]{1,3}\d+")  # s0, u3, ps12: a bare symbol name (sympify makes a Symbol)


class UnsafeArtifactError(ValueError):
    """The ``.pt2`` archive holds something other than a pickle-free program's entries."""


def _entries(archive: zipfile.ZipFile, where: str) -> dict[str, str]:
    """The archive's entries by their name under its one top folder (``relative -> full name``)."""
    names = archive.namelist()
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


def _payload_names(archive: zipfile.ZipFile, entries: dict[str, str], where: str) -> set[str]:
    """The payload files the configs name; refused unless every payload is raw tensor bytes."""
    named = set()
    for config_name, (folder, pattern) in PAYLOADS.items():
        try:
            config = json.loads(archive.read(entries[config_name])).get("config", {})
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


def _expressions(node: Any) -> Iterator[str]:
    """Every ``expr_str`` in the program's JSON (the strings the loader passes to ``sympy.sympify``)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr_str":
                yield value if isinstance(value, str) else repr(value)
            else:
                yield from _expressions(value)
    elif isinstance(node, list):
        for item in node:
            yield from _expressions(item)


def _plain_expression(text: str) -> bool:
    """Whether evaluating ``text`` can do nothing but build a sympy expression."""
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in SYMPY_NAMES:
                return False
        elif isinstance(node, ast.Name):
            if node.id not in SYMPY_NAMES and not SHAPE_SYMBOL.fullmatch(node.id):
                return False
        elif isinstance(node, ast.Constant):
            if not isinstance(node.value, int | float | str | bool | type(None)):
                return False
        elif not isinstance(
            node, ast.Expression | ast.keyword | ast.Load | ast.UnaryOp | ast.USub | ast.UAdd
        ):
            return False
    return True


def _check_expressions(archive: zipfile.ZipFile, name: str, where: str) -> None:
    try:
        program = json.loads(archive.read(name))
    except ValueError as error:
        raise UnsafeArtifactError(f"{where}: {name} is not JSON ({error})") from error
    for text in _expressions(program):
        if not _plain_expression(text):
            raise UnsafeArtifactError(
                f"{where}: {name} holds the shape expression {text[:120]!r}, which is not a plain sympy "
                "expression; torch.export.load would evaluate it as Python"
            )


def check_archive(data: bytes, where: str) -> None:
    """Raise ``UnsafeArtifactError`` unless ``data`` holds only the entries of a pickle-free program."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as error:
        raise UnsafeArtifactError(f"{where}: not a torch.export archive ({error})") from error
    with archive:
        entries = _entries(archive, where)
        missing = [name for name in REQUIRED if name not in entries]
        if missing:
            raise UnsafeArtifactError(f"{where}: no {missing[0]} (a legacy or foreign format)")
        allowed = ALLOWED | _payload_names(archive, entries, where)
        for relative, name in sorted(entries.items()):
            if relative not in allowed:
                raise UnsafeArtifactError(
                    f"{where}: entry {name!r} is not one that torch.export.save writes for a pickle-free "
                    "program (torch.export.load would unpickle legacy entries); re-export with "
                    "torch.export.save"
                )
        _check_expressions(archive, entries[f"models/{MODEL}.json"], where)
        try:
            torch.load(io.BytesIO(archive.read(entries[SAMPLE_INPUTS])), weights_only=True)
        except Exception as error:
            raise UnsafeArtifactError(
                f"{where}: sample inputs {entries[SAMPLE_INPUTS]} do not load with weights_only=True"
            ) from error


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
    """``torch.export.load`` of the very bytes ``check_archive`` accepted (``where`` names them)."""
    check_archive(data, where)
    program = torch.export.load(io.BytesIO(data))
    if not hasattr(program, "_guards_code"):  # fail closed if torch moves them where this cannot see
        raise UnsafeArtifactError(
            f"{where}: this torch keeps a program's guard code where it cannot be dropped"
        )
    program._guards_code = []  # code strings from the file: never executed
    return program


def load_exported_program(path: str | Path) -> torch.export.ExportedProgram:
    """The program at ``path``, through ``check_archive``."""
    return load_program_bytes(_read(path), str(path))
