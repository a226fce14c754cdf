"""Does each served model run the ``config.pbtxt`` on disk? Triton keeps the config it loaded while a
rebuild rewrites the file. Every field the file sets must hold in the served config (Triton's defaults
are no drift), compared as ``model_config.proto`` messages so formatting and int64-as-string do not count."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from tritonclient.grpc import model_config_pb2

MAX_LISTED = 3  # differences named per model; the rest are counted


def _shown(field: FieldDescriptor, value: Any) -> str:
    if field.type == FieldDescriptor.TYPE_ENUM:
        known = field.enum_type.values_by_number.get(value)
        return known.name if known is not None else str(value)
    return repr(value) if isinstance(value, str) else str(value)


def _value_differences(field: FieldDescriptor, mine: Any, theirs: Any, name: str) -> list[str]:
    """One value of ``field``: a message compared field by field, a scalar as a whole."""
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return differences(mine, theirs, name + ".")
    return (
        [] if mine == theirs else [f"{name}: {_shown(field, mine)} on disk, {_shown(field, theirs)} served"]
    )


def differences(on_disk: Message, served: Message, prefix: str = "") -> list[str]:
    """Every field ``on_disk`` sets whose value ``served`` does not hold, as ``path: disk, served``."""
    found: list[str] = []
    for field, value in on_disk.ListFields():
        name, other = prefix + field.name, getattr(served, field.name)
        messages = field.is_repeated and field.type == FieldDescriptor.TYPE_MESSAGE
        if messages and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            for key in value:
                where = f"{name}[{key!r}]"
                if key in other:
                    found += _value_differences(value_field, value[key], other[key], where)
                else:
                    found.append(f"{where}: on disk, not served")
        elif messages and len(value) != len(other):
            found.append(f"{name}: {len(value)} entries on disk, {len(other)} served")
        elif messages:
            for index, (mine, theirs) in enumerate(zip(value, other, strict=True)):
                found += differences(mine, theirs, f"{name}[{index}].")
        elif field.is_repeated and list(value) != list(other):
            mine, theirs = [_shown(field, v) for v in value], [_shown(field, v) for v in other]
            found.append(f"{name}: {mine} on disk, {theirs} served")
        elif not field.is_repeated:
            found += _value_differences(field, value, other, name)
    return found


def config_drift(repository: Path, model: str, served: dict[str, Any]) -> str:
    """One line: how ``model``'s ``config.pbtxt`` in ``repository`` differs from ``served`` (the model
    config API's JSON), its first differences and what to do about them; "" when the server runs what is
    on disk, or when there is no readable file to compare."""
    config_path = Path(repository) / model / "config.pbtxt"
    try:
        on_disk = text_format.Parse(config_path.read_text(), model_config_pb2.ModelConfig())
    except (OSError, text_format.ParseError):
        return ""
    try:
        running = json_format.ParseDict(served, model_config_pb2.ModelConfig(), ignore_unknown_fields=True)
    except json_format.ParseError:  # not a config this proto reads: nothing to claim
        return ""
    found = differences(on_disk, running)
    if not found:
        return ""
    listed = "; ".join(found[:MAX_LISTED])
    if len(found) > MAX_LISTED:
        listed += f"; and {len(found) - MAX_LISTED} more"
    return f"SERVED CONFIG DIFFERS from {config_path} ({listed}); reload the model to serve what is on disk"
