"""The file that tells the fronts which served configs changed (fault matrix row 79), without a server."""

from __future__ import annotations

from pathlib import Path

from server.config_changes import Changed, ConfigChanges, mark_changed


def test_a_front_reads_each_line_once_and_only_what_came_after_it_started(tmp_path: Path) -> None:
    path = tmp_path / "config_changes"
    assert not ConfigChanges(path).poll()  # no file yet: nothing changed
    mark_changed(path)  # the launcher's first start, before the fronts
    mark_changed(path, "before")
    front = ConfigChanges(path)
    assert not front.poll()
    mark_changed(path, "trivial")
    mark_changed(path, "recommender")
    assert front.poll() == Changed(frozenset({"trivial", "recommender"}))
    assert not front.poll()
    mark_changed(path)  # tritonserver started again
    changed = front.poll()
    assert changed.every and changed.covers("never named")


def test_a_line_not_yet_whole_waits_for_the_next_look(tmp_path: Path) -> None:
    path = tmp_path / "config_changes"
    path.write_bytes(b"")
    front = ConfigChanges(path)
    with path.open("ab") as handle:
        handle.write(b'"trivial"\n"recomm')
    assert front.poll() == Changed(frozenset({"trivial"}))
    with path.open("ab") as handle:
        handle.write(b'ender"\n')
    assert front.poll() == Changed(frozenset({"recommender"}))


def test_a_file_removed_or_not_ours_trusts_nothing(tmp_path: Path) -> None:
    path = tmp_path / "config_changes"
    mark_changed(path, "trivial")
    front = ConfigChanges(path)
    path.unlink()
    assert front.poll().every
    mark_changed(path, "trivial")
    assert front.poll() == Changed(frozenset({"trivial"}))
    with path.open("ab") as handle:
        handle.write(b"not json\n")
    assert front.poll().every
