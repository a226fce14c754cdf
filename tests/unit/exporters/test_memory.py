"""Memory per instance: measured on demand (not by every export), once per exported file."""

from __future__ import annotations

import json
from pathlib import Path

import onnx

from exporters.artifacts.records import write_record
from exporters.memory import MEMORY_RECORD, measured_instance_memory
from exporters.onnx_export import export_onnx


def weights_bytes(model: Path) -> int:
    """The bytes of the model's initializers (its weights), as stored."""
    graph = onnx.load(str(model), load_external_data=False).graph
    return sum(len(t.raw_data) or onnx.numpy_helper.to_array(t).nbytes for t in graph.initializer)


def test_export_alone_measures_no_memory(model_spec, tmp_path: Path) -> None:
    artifact = export_onnx(model_spec("recommender"), tmp_path)
    assert not (tmp_path / MEMORY_RECORD).exists()
    assert "instance_memory_bytes" not in json.loads((tmp_path / "export.json").read_text())
    assert export_onnx(model_spec("recommender"), tmp_path).cached  # and its record is not stale for it
    assert artifact.path.is_file()


def test_memory_is_measured_then_read_back_for_the_same_file(model_spec, tmp_path: Path) -> None:
    spec = model_spec("recommender")
    artifact = export_onnx(spec, tmp_path)
    measured = measured_instance_memory(spec, artifact.path)
    assert measured >= weights_bytes(artifact.path)  # an instance holds at least its weights
    record = json.loads((tmp_path / MEMORY_RECORD).read_text())
    key = f"cpu@{spec.max_batch_size}"
    assert record["instance_bytes"] == {key: measured}
    # A figure recorded for this very file is used as it is: no second measurement.
    write_record(tmp_path / MEMORY_RECORD, {**record, "instance_bytes": {key: 12345}})
    assert measured_instance_memory(spec, artifact.path) == 12345
    # A record of another file (its SHA-256) is not: the file is measured afresh.
    write_record(tmp_path / MEMORY_RECORD, {"file_sha256": "0" * 64, "instance_bytes": {key: 12345}})
    again = measured_instance_memory(spec, artifact.path)
    assert again >= weights_bytes(artifact.path)
    assert json.loads((tmp_path / MEMORY_RECORD).read_text())["instance_bytes"] == {key: again}
