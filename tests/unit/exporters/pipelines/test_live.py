"""Publishing a new dense version without a server: a failed attempt leaves nothing, a retry works, and
the new version takes the boundary tensor of the build it joins."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import onnx
import pytest

from exporters.errors import ExportCheckError, SpecError
from exporters.pipelines import live
from exporters.pipelines.build import build_pipelines
from exporters.pipelines.live import publish_dense_version
from exporters.schema.models import parse_spec


def test_a_failed_publish_leaves_no_version_and_a_retry_succeeds(
    spec_data: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = copy.deepcopy(spec_data)
    data["pipelines"] = [{"name": "rec", "model": "recommender", "split": "embedding_dense"}]
    spec = parse_spec(data)
    pipeline, model = spec.pipeline("rec"), spec.model("recommender")
    with pytest.raises(SpecError, match=r"rec: no pipeline\.json"):
        publish_dense_version(pipeline, model, tmp_path, version=2, seed=7)
    build_pipelines(spec, tmp_path, num_gpus=0, only=["rec"])

    def mismatch(*args: object, **kwargs: object) -> None:
        raise ExportCheckError("rec_dense v2: does not match torch")

    with monkeypatch.context() as patch:
        patch.setattr(live, "check_stages", mismatch)
        with pytest.raises(ExportCheckError, match="rec_dense v2"):
            publish_dense_version(pipeline, model, tmp_path, version=2, seed=7)
    assert sorted(p.name for p in (tmp_path / "rec_dense").iterdir()) == ["1", "config.pbtxt"]

    publish_dense_version(pipeline, model, tmp_path, version=2, seed=7)
    assert sorted(p.name for p in (tmp_path / "rec_dense").iterdir()) == ["1", "2", "config.pbtxt"]
    assert [p.name for p in (tmp_path / "rec_dense" / "2").iterdir()] == ["model.onnx"]
    inputs = [
        [i.name for i in onnx.load(str(tmp_path / "rec_dense" / v / "model.onnx")).graph.input] for v in "12"
    ]
    assert inputs[0] == inputs[1] and inputs[0][1].startswith("embeddings_")
