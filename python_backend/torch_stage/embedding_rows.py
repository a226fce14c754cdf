"""Embedding tables of a stage: id checks on lookups, and row updates checked whole and applied only
between batches, so no lookup sees half of one. Torch only: copied beside each stage's model.py."""

from __future__ import annotations

from collections.abc import Sequence

import torch

try:  # beside model.py inside the stub
    from batching import InvalidInputError
except ImportError:  # imported as a package (exporters, unit tests)
    from python_backend.batching import InvalidInputError

# The update contract, defined here once: the config writer, the update helper and the runner read it.
# Shapes: table and row ids [N, 1] int64, values [N, D] fp32.
UPDATE_TABLE, UPDATE_ROW, UPDATE_VALUES = "update_table", "update_row", "update_values"
UPDATE_INPUTS = (UPDATE_TABLE, UPDATE_ROW, UPDATE_VALUES)
UPDATE_VERSION = "update_version"  # the answer to an update: row updates applied so far


def check_ids(ids: torch.Tensor, tables: Sequence[torch.Tensor], input_name: str) -> None:
    """Column ``i`` of ``ids`` indexes table ``i``; an id outside it is the client's error, named."""
    if ids.shape[1] != len(tables):
        raise InvalidInputError(
            f"input '{input_name}' has {ids.shape[1]} columns, one per table ({len(tables)})"
        )
    sizes = torch.tensor([t.shape[0] for t in tables], device=ids.device)
    outside = (ids < 0) | (ids >= sizes)
    if bool(outside.any()):
        row, column = (int(i) for i in outside.nonzero()[0])
        raise InvalidInputError(
            f"input '{input_name}' column {column} holds id {int(ids[row, column])} outside table {column} "
            f"(rows 0..{tables[column].shape[0] - 1})"
        )


def check_row_updates(
    tables: Sequence[torch.Tensor], table: torch.Tensor, row: torch.Tensor, values: torch.Tensor
) -> None:
    """``InvalidInputError`` naming the input unless the whole update can be applied."""
    table, row = table.reshape(-1), row.reshape(-1)
    if not table.shape[0] == row.shape[0] == values.shape[0]:
        raise InvalidInputError(
            f"inputs {', '.join(UPDATE_INPUTS)} must have the same rows, got "
            f"{table.shape[0]}, {row.shape[0]}, {values.shape[0]}"
        )
    if table.numel() and (int(table.min()) < 0 or int(table.max()) >= len(tables)):
        raise InvalidInputError(f"input '{UPDATE_TABLE}' must be in 0..{len(tables) - 1}")
    if not torch.isfinite(values).all():
        raise InvalidInputError(f"input '{UPDATE_VALUES}' holds NaN or infinity")
    for index in range(len(tables)):
        rows = row[table == index]
        if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= tables[index].shape[0]):
            last = tables[index].shape[0] - 1
            message = f"input '{UPDATE_ROW}' holds a row outside table {index} (rows 0..{last})"
            raise InvalidInputError(message)
        if values.shape[1] != tables[index].shape[1]:
            width = tables[index].shape[1]
            raise InvalidInputError(
                f"input '{UPDATE_VALUES}' has width {values.shape[1]}, table {index} has {width}"
            )


def apply_row_updates(
    tables: Sequence[torch.Tensor], table: torch.Tensor, row: torch.Tensor, values: torch.Tensor
) -> int:
    """Overwrite ``tables[table[i]][row[i]] = values[i]`` for every i, all or nothing (later rows win);
    the rows written."""
    check_row_updates(tables, table, row, values)
    table, row = table.reshape(-1), row.reshape(-1)
    with torch.no_grad():
        for index in range(len(tables)):
            chosen = table == index
            if chosen.any():
                target = tables[index]
                target.index_put_(
                    (row[chosen].to(target.device),), values[chosen].to(target.device, target.dtype)
                )
    return int(table.numel())
