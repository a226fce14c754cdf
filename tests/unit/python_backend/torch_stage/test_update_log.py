"""The embedding stage's write-ahead log: what is appended comes back in order; a torn tail is cut off."""

from __future__ import annotations

from pathlib import Path

import torch

from python_backend.torch_stage import update_log
from python_backend.torch_stage.embedding_rows import apply_row_updates

UPDATES = 1000


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
    replayed = update_log.read(path)[1]
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
    assert len(update_log.read(str(path))[1]) == 1
    assert path.stat().st_size == whole  # the never-acknowledged tail is gone
    update_log.append(str(path), *_update(0, [3], 3.0))
    assert [int(r[1][0]) for r in update_log.read(str(path))[1]] == [1, 3]


def test_missing_log_replays_nothing(tmp_path: Path) -> None:
    assert update_log.read(str(tmp_path / "none.wal"))[1] == []


def _serve(path: Path, tables: list[torch.Tensor], compact_bytes: int) -> update_log.UpdateLog:
    log = update_log.UpdateLog(str(path), tables, compact_bytes)
    log.replay(apply_row_updates)
    return log


def test_log_stays_bounded_and_replays_to_the_same_tables_and_version(tmp_path: Path) -> None:
    """1,000 updates to 40 rows: the log is rewritten as a snapshot whenever it outgrows the bound
    (39 times here), and a restart (a fresh stage replaying it) gets exactly the live tables
    and the same version."""
    path = tmp_path / update_log.LOG_NAME
    live = [torch.zeros(30, 4), torch.zeros(20, 4)]
    log = _serve(path, live, compact_bytes=4096)
    generator = torch.Generator().manual_seed(0)
    largest = 0
    for step in range(UPDATES):
        table = step % 2
        rows = torch.randint(0, 20, (3,), generator=generator).tolist()
        update = _update(table, rows, float(step))
        log.append(*update)
        apply_row_updates(live, *update)
        log.compact_if_due()
        largest = max(largest, path.stat().st_size)
    assert log.version == UPDATES
    assert largest <= 2 * max(4096, log.snapshot_bytes) + 1024, largest  # never the 1,000 records' 74 KB
    restarted = [torch.zeros(30, 4), torch.zeros(20, 4)]
    again = _serve(path, restarted, compact_bytes=4096)
    assert again.version == UPDATES
    for mine, theirs in zip(live, restarted, strict=True):
        assert torch.equal(mine, theirs)
    assert again.touched == log.touched


def test_a_crash_while_compacting_leaves_the_old_log_whole(tmp_path: Path) -> None:
    path = tmp_path / update_log.LOG_NAME
    tables = [torch.zeros(4, 4)]
    log = _serve(path, tables, compact_bytes=1 << 20)
    for value in (1.0, 2.0):
        log.append(*_update(0, [1], value))
        apply_row_updates(tables, *_update(0, [1], value))
    (tmp_path / f"{update_log.LOG_NAME}.compacting").write_bytes(b"EWLB half a snapshot")  # died mid-write
    restarted = [torch.zeros(4, 4)]
    assert _serve(path, restarted, compact_bytes=1 << 20).version == 2
    assert restarted[0][1].tolist() == [2.0] * 4


def test_a_snapshot_keeps_counting_and_takes_later_updates(tmp_path: Path) -> None:
    path = tmp_path / update_log.LOG_NAME
    tables = [torch.zeros(4, 4)]
    log = _serve(path, tables, compact_bytes=1 << 20)
    for value in (1.0, 2.0, 3.0):
        log.append(*_update(0, [2], value))
        apply_row_updates(tables, *_update(0, [2], value))
    log.compact()
    updates, records = update_log.read(str(path))
    assert updates == 3 and len(records) == 1  # one row, its latest value
    log.append(*_update(0, [0], 9.0))
    restarted = [torch.zeros(4, 4)]
    assert _serve(path, restarted, compact_bytes=1 << 20).version == 4
    assert restarted[0][2].tolist() == [3.0] * 4 and restarted[0][0].tolist() == [9.0] * 4


def test_a_log_of_another_artifact_is_set_aside_not_replayed(tmp_path: Path) -> None:
    """Rebuilt weights (another artifact) never get the old build's updates; the old log is kept aside."""
    path = tmp_path / update_log.LOG_NAME
    old, new = "a" * 64, "b" * 64
    served = [torch.zeros(4, 4)]
    first = update_log.UpdateLog(str(path), served, artifact=old)
    assert first.replay(apply_row_updates) is None  # no log yet
    for row, value in ((2, 5.0), (1, 6.0)):
        first.append(*_update(0, [row], value))
        apply_row_updates(served, *_update(0, [row], value))
        if row == 2:
            first.compact()  # a snapshot names its artifact too
    assert update_log.artifact_of(str(path)) == old

    same = [torch.zeros(4, 4)]
    assert update_log.UpdateLog(str(path), same, artifact=old).replay(apply_row_updates) is None
    assert same[0][2].tolist() == [5.0] * 4 and same[0][1].tolist() == [6.0] * 4

    rebuilt = [torch.zeros(4, 4)]
    log = update_log.UpdateLog(str(path), rebuilt, artifact=new)
    aside = log.replay(apply_row_updates)
    assert aside is not None and Path(aside).name.startswith(f"{update_log.LOG_NAME}.set-aside-{old[:12]}-")
    assert not path.exists() and Path(aside).is_file()
    assert rebuilt[0].count_nonzero() == 0 and log.version == 0
    log.append(*_update(0, [3], 7.0))
    assert update_log.artifact_of(str(path)) == new and update_log.read(str(path))[0] == 1


def test_a_log_that_names_no_artifact_is_set_aside_once_the_artifact_is_known(tmp_path: Path) -> None:
    path = tmp_path / update_log.LOG_NAME
    update_log.append(str(path), *_update(0, [1], 1.0))  # the format before logs named their artifact
    tables = [torch.zeros(4, 4)]
    aside = update_log.UpdateLog(str(path), tables, artifact="c" * 64).replay(apply_row_updates)
    assert aside is not None and "set-aside-unknown-" in aside and tables[0].count_nonzero() == 0
