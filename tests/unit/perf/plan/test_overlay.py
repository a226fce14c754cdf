"""The planned spec builds where it was written: ``spec.planned.yaml`` lives in a report folder, where a
base spec's relative source paths point nowhere, so the one overlay writer tune and plan share writes
them resolved against the base spec's folder. Built here with ``python -m exporters build`` from a
third folder, as a user would build the answer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import onnx
import yaml
from onnx import TensorProto, helper

from perf.plan.overlay import write_plan_overlay

ROOT = Path(__file__).resolve().parents[4]


def doubling_model(path: Path) -> Path:
    """A tiny ONNX file with a batch axis: ``y = x + x`` over ``[batch, 4]``."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["y"])],
        "doubling",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, str(path))
    return path


def test_the_planned_spec_builds_from_any_folder(tmp_path: Path) -> None:
    base = tmp_path / "project"
    (base / "files").mkdir(parents=True)
    doubling_model(base / "files" / "doubling.onnx")
    spec_path = base / "models.yaml"
    entry = {"name": "doubling", "source": {"onnx": "files/doubling.onnx"}, "max_batch_size": 8}
    spec_path.write_text(yaml.safe_dump({"models": [entry]}))
    report = tmp_path / "reports" / "plan"
    report.mkdir(parents=True)
    overlay = {"models": [{
        "name": "doubling", "max_batch_size": 8, "batching": {"mode": "dynamic", "max_queue_delay_us": 500},
        "instances": {"cpu": 2},
    }]}  # fmt: skip
    write_plan_overlay(spec_path, overlay, report, "test")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    built = subprocess.run(
        [sys.executable, "-m", "exporters", "build", "--spec", str(report / "spec.planned.yaml"),
         "--repository", str(tmp_path / "repository")],
        cwd=elsewhere, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    config = (tmp_path / "repository" / "doubling" / "config.pbtxt").read_text()
    assert "max_queue_delay_microseconds: 500" in config and "count: 2" in config
    assert (tmp_path / "repository" / "doubling" / "1" / "model.onnx").is_file()
