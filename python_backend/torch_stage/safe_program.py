"""Load a ``torch.export`` program (``.pt2``) without ever unpickling: the stage artifact format.

``torch.export.load`` unpickles in three places: weights or constants flagged ``use_pickle`` (tensor
subclasses), custom-object constants, and the sample inputs when they do not load with
``weights_only=True`` (it falls back to a full unpickle). A tampered artifact could carry code in any
of them, so the archive is inspected first and refused unless every tensor is a plain payload and the
sample inputs load under ``weights_only=True``. Only then does ``torch.export.load`` run.

Standard library and torch only: copied beside each stage's model.py, unit-tested without a server.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import torch


class UnsafeArtifactError(ValueError):
    """The ``.pt2`` archive holds something that would be unpickled on load."""


def _payload_configs(archive: zipfile.ZipFile) -> dict[str, dict]:
    configs = {}
    for name in archive.namelist():
        parts = name.split("/")
        if len(parts) >= 3 and parts[-3] == "data" and parts[-1].endswith("_config.json"):
            configs[name] = json.loads(archive.read(name))
    return configs


def check_no_pickle(path: str | Path) -> None:
    """Raise ``UnsafeArtifactError`` unless loading ``path`` cannot unpickle anything."""
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as error:
        raise UnsafeArtifactError(f"{path}: not a torch.export archive ({error})") from error
    with archive:
        configs = _payload_configs(archive)
        if not configs:
            raise UnsafeArtifactError(f"{path}: no weights/constants configs (legacy or foreign format)")
        for config_name, config in configs.items():
            for fqn, payload in config.get("config", {}).items():
                if payload.get("use_pickle") or not str(payload.get("path_name", "")).startswith(
                    ("weight_", "tensor_")
                ):
                    raise UnsafeArtifactError(f"{path}: {fqn!r} in {config_name} would be unpickled")
        for name in archive.namelist():
            if "/data/sample_inputs/" in name:
                try:
                    torch.load(io.BytesIO(archive.read(name)), weights_only=True)
                except Exception as error:
                    raise UnsafeArtifactError(
                        f"{path}: sample inputs {name} do not load with weights_only=True"
                    ) from error


def load_exported_program(path: str | Path) -> torch.export.ExportedProgram:
    """``torch.export.load`` after ``check_no_pickle``."""
    check_no_pickle(path)
    return torch.export.load(str(path))
