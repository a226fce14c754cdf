"""The embedding stage's write-ahead log: what is appended comes back in order; a torn tail is cut off."""

from __future__ import annotations

from pathlib import Path

import torch

from python_backend.torch_stage import update_log
from python_backend.torch_stage.embedding_rows import apply_row_updates


def _update(table: int, rows: list[int], value: float, width: int = 4):
    count = len(rows)
    return (
        torch.full((count, 1), table, dtype=torch.int64),
        torch.tensor(rows, dtype=torch.int64).reshape(-1, 1),
        torch.full((count, width), value),
    )


def test_replay_returns_every_update_in_order(tmp_path: Path) -> None:
    path = str(tmp_path / update_log.LOG_NAME)
    updates = [_update(0, [1, 2], 0.5), _update(1, [0], -2.0), _update(0, [1], 3.0)]
    for update in updates:
        update_log.append(path, *update)
    replayed = list(update_log.replay(path))
    assert len(replayed) == 3
    for (table, row, values), (want_table, want_row, want_values) in zip(replayed, updates, strict=True):
        assert torch.equal(table, want_table.reshape(-1)) and torch.equal(row, want_row.reshape(-1))
        assert torch.equal(values, want_values)
    tables = [torch.zeros(4, 4), torch.zeros(3, 4)]
    for record in replayed:
        apply_row_updates(tables, *record)
    assert tables[0][1].tolist() == [3.0] * 4 and tables[0][2].tolist() == [0.5] * 4  # later wins
    assert tables[1][0].tolist() == [-2.0] * 4


def test_torn_tail_is_truncated_and_earlier_records_kept(tmp_path: Path) -> None:
    path = tmp_path / update_log.LOG_NAME
    update_log.append(str(path), *_update(0, [1], 1.0))
    whole = path.stat().st_size
    record = update_log.encode(*_update(0, [2], 2.0))
    with open(path, "ab") as handle:
        handle.write(record[: len(record) - 3])  # a crash in the middle of the second append
    assert len(list(update_log.replay(str(path)))) == 1
    assert path.stat().st_size == whole  # the never-acknowledged tail is gone
    update_log.append(str(path), *_update(0, [3], 3.0))
    assert [int(r[1][0]) for r in update_log.replay(str(path))] == [1, 3]


def test_missing_log_replays_nothing(tmp_path: Path) -> None:
    assert list(update_log.replay(str(tmp_path / "none.wal"))) == []
