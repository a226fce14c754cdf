"""The tuner's overlay goes through the spec's own validation; its candidates and its options."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from exporters.errors import SpecError
from exporters.repository import build_repository
from exporters.resolve import load_spec
from perf.model.batcher import BatcherConfig
from perf.spec_overlay import apply_overlay, config_json, write_overlay

SPEC = Path(__file__).resolve().parents[3] / "models.yaml"
FACTORIES = Path(__file__).resolve().parents[2] / "data" / "own_factories"


def test_the_overlay_replaces_batching_whole_and_validates(tmp_path: Path) -> None:
    base = load_spec(SPEC).model("recommender")
    tuned = write_overlay(SPEC, base, BatcherConfig(16, 2000, (8,), instances=2), tmp_path, "test")
    model = tuned.model("recommender")
    assert (model.max_batch_size, model.instances.cpu) == (16, 2)
    assert model.batching.max_queue_delay_us == 2000 and model.batching.preferred_batch_sizes == (8,)
    assert model.batching.queue is None  # dropped: the 2.51 queue-policy stall (README, Known limits)
    overlay = yaml.safe_load((tmp_path / "overlay.yaml").read_text())
    assert [m["name"] for m in overlay["models"]] == ["recommender"]
    assert load_spec(tmp_path / "spec.tuned.yaml").model("image_classifier") == load_spec(SPEC).model(
        "image_classifier"
    )  # every other model untouched


def test_keeping_the_queue_policy_is_an_option(tmp_path: Path) -> None:
    base = load_spec(SPEC).model("recommender")
    tuned = write_overlay(SPEC, base, BatcherConfig(32, 500), tmp_path, "test", keep_queue=True)
    assert tuned.model("recommender").batching.queue == base.batching.queue


def test_no_batching_is_written_as_mode_none(tmp_path: Path) -> None:
    base = load_spec(SPEC).model("recommender")
    tuned = write_overlay(SPEC, base, BatcherConfig(1), tmp_path, "test")
    assert tuned.model("recommender").batching.mode == "none"


def test_a_bad_overlay_fails_through_the_spec_naming_the_field() -> None:
    document = yaml.safe_load(SPEC.read_text())
    with pytest.raises(ValueError, match="not a model of the base spec"):
        apply_overlay(document, {"models": [{"name": "nope"}]})
    merged = apply_overlay(
        document,
        {"models": [{"name": "recommender", "batching": {"mode": "dynamic", "max_queue_delay_us": -1}}]},
    )
    from exporters.schema.models import parse_spec

    with pytest.raises(SpecError, match="max_queue_delay_us"):
        parse_spec(merged)


def test_the_config_override_is_triton_json_with_the_candidate() -> None:
    base = load_spec(SPEC).model("recommender")
    from perf.spec_overlay import candidate_spec

    config = json.loads(config_json(candidate_spec(base, BatcherConfig(8, 1500, instances=2))))
    assert config["maxBatchSize"] == 8
    assert config["dynamicBatching"]["maxQueueDelayMicroseconds"] == "1500"
    assert config["instanceGroup"][0]["count"] == 2
    assert "defaultQueuePolicy" not in config["dynamicBatching"]


def test_the_tuned_spec_of_an_outside_spec_with_relative_paths_builds_from_anywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(FACTORIES / "factories.py", project / "factories.py")
    entry = {
        "name": "tiny", "source": {"python": "factories:tiny_logits", "path": "."},
        "sample": "factories:sample", "options": {"scale": 1.0}, "max_batch_size": 4,
        "inputs": [{"name": "x", "dtype": "fp32", "shape": [16]}],
        "outputs": [{"name": "logits", "dtype": "fp32", "shape": [10]}],
    }  # fmt: skip
    (project / "models.yaml").write_text(yaml.safe_dump({"models": [entry]}))
    report = tmp_path / "reports" / "tune"
    report.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # neither the spec's folder nor the report's
    base = load_spec(project / "models.yaml").model("tiny")
    write_overlay(project / "models.yaml", base, BatcherConfig(4, 500), report, "test")
    tuned = yaml.safe_load((report / "spec.tuned.yaml").read_text())
    assert tuned["models"][0]["source"] == {"python": "factories:tiny_logits", "path": str(project)}
    built = build_repository(load_spec(report / "spec.tuned.yaml"), tmp_path / "repo", num_gpus=0)
    assert [b.spec.name for b in built] == ["tiny"] and (
        tmp_path / "repo" / "tiny" / "1" / "model.onnx"
    ).exists()
