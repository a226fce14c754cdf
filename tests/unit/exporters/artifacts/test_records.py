"""The artifact file hash (``exporters.artifacts.records``): a changed file is told from the one
recorded."""

from __future__ import annotations

from pathlib import Path

from exporters.artifacts.records import file_matches, file_sha256


def test_file_hash_detects_a_changed_artifact(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(b"abc" * 1000)
    digest = file_sha256(path)
    assert file_matches(path, digest)
    path.write_bytes(b"abc" * 999)
    assert not file_matches(path, digest)
    assert not file_matches(path, None)
    assert not file_matches(tmp_path / "missing.onnx", digest)
