"""Pipeline builds without a server: parity checks, caching, compression figures, configs as text."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from exporters.configs.model_config import read_config
from exporters.errors import ExportCheckError, StageExportError
from exporters.pipelines import build as pipeline_build
from exporters.pipelines import splitter
from exporters.pipelines.build import PipelineRecord, build_pipelines, make_stages
from exporters.pipelines.stages import Stage, check_stages, export_stage
from exporters.schema.models import Spec, TensorSpec, parse_spec
from exporters.sources.load import build_torch_model

PIPELINES = [
    {"name": "rec", "model": "recommender", "split": "embedding_dense", "live_updates": True},
    {"name": "rec16", "model": "recommender", "split": "embedding_dense", "boundary_dtype": "fp16"},
    {"name": "cls", "model": "image_classifier", "split": "blocks", "cut_points": [3], "replicas": [1, 2]},
    {"name": "cls3", "model": "image_classifier", "split": "blocks", "cut_points": [2, 6],
     "boundary_dtype": "bf16"},
]  # fmt: skip


@pytest.fixture(scope="module")
def spec(spec_data: dict[str, Any]) -> Spec:
    data = copy.deepcopy(spec_data)
    data["pipelines"] = PIPELINES
    return parse_spec(data)


@pytest.fixture(scope="module")
def built(spec: Spec, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    repository = tmp_path_factory.mktemp("pipelines")
    return repository, {b.spec.name: b for b in build_pipelines(spec, repository, num_gpus=0)}


def test_records_state_parity_and_boundary_bytes(built) -> None:
    repository, pipelines = built
    for name, item in pipelines.items():
        record = PipelineRecord.from_json(json.loads((repository / name / "pipeline.json").read_text()))
        assert record == item.record
        assert record.split_max_rel_error <= 1e-4 and not item.cached
    assert [s.name for s in pipelines["cls3"].record.stages] == [
        "cls3_stage0",
        "cls3_stage1",
        "cls3_stage2",
    ]
    assert [s.blocks for s in pipelines["cls3"].record.stages] == [(0, 2), (2, 6), (6, 10)]


def test_compression_halves_the_bytes_and_states_its_error(built) -> None:
    _, pipelines = built
    rec, rec16 = pipelines["rec"].record, pipelines["rec16"].record
    assert rec.boundary_bytes_per_request == 8 * 32 * 4 and rec.boundary_bytes_saved_per_request == 0
    assert rec16.boundary_bytes_per_request == 8 * 32 * 2
    assert rec16.boundary_bytes_saved_per_request == 8 * 32 * 2
    assert 0 < rec16.compression_max_rel_error <= 2e-2 and rec.compression_max_rel_error == 0
    cls3 = pipelines["cls3"].record
    assert [b.dtype for b in cls3.boundaries] == ["bf16", "bf16"]
    assert 0 < cls3.compression_max_rel_error <= 5e-2


def test_rebuild_is_cached_and_keeps_the_cuts(spec: Spec, built) -> None:
    repository, first = built
    again = {b.spec.name: b for b in build_pipelines(spec, repository, num_gpus=0, only=["cls"])}
    assert list(again) == ["cls"] and again["cls"].cached
    assert again["cls"].record == first["cls"].record


def test_every_config_parses_with_the_schema(built) -> None:
    repository, pipelines = built
    for item in pipelines.values():
        for config in item.configs:
            assert read_config(repository / config.name / "config.pbtxt") == config.to_proto()


def test_cpu_placement_and_replicas(built) -> None:
    repository, _ = built
    stage1 = read_config(repository / "cls_stage1" / "config.pbtxt")
    kinds = [(model_config_pb2.ModelInstanceGroup.Kind.Name(g.kind), g.count) for g in stage1.instance_group]
    assert kinds == [("KIND_CPU", 2)]
    assert (
        stage1.backend == "python" and stage1.parameters["FORCE_CPU_ONLY_INPUT_TENSORS"].string_value == "no"
    )
    assert stage1.dynamic_batching.max_queue_delay_microseconds == 100  # downstream: re-forms the burst


def test_multi_gpu_placement_as_text(spec: Spec, built, tmp_path: Path) -> None:
    """Stage k on GPU k mod G, checked as the config text a 2-GPU host would get (no GPU needed).

    Built over a copy of the module's build: placement changes the configs, not the exported stages."""
    shutil.copytree(built[0], tmp_path, dirs_exist_ok=True)
    placed = {b.spec.name: b for b in build_pipelines(spec, tmp_path, num_gpus=2, only=["cls3", "rec"])}
    assert all(b.cached for b in placed.values())
    texts = {c.name: text_format.MessageToString(c.to_proto()) for b in placed.values() for c in b.configs}
    for stage, gpu in (("cls3_stage0", 0), ("cls3_stage1", 1), ("cls3_stage2", 0)):
        assert f"instance_group {{\n  count: 1\n  gpus: {gpu}\n  kind: KIND_GPU\n}}" in texts[stage], texts[
            stage
        ]
    assert "gpus: 1\n  kind: KIND_GPU" in texts["rec_dense"] and "tensorrt" in texts["rec_dense"]
    assert "gpus: 0\n  kind: KIND_GPU" in texts["rec_embedding"]
    assert "instance_group" not in texts["cls3"]  # the ensemble itself runs nowhere


def test_ensemble_chains_stages_through_named_tensors(built) -> None:
    """Boundary tensors carry the build's id: stages of two builds cannot be chained by Triton."""
    repository, pipelines = built
    steps = read_config(repository / "cls3" / "config.pbtxt").ensemble_scheduling.step
    assert [s.model_name for s in steps] == ["cls3_stage0", "cls3_stage1", "cls3_stage2"]
    build = pipelines["cls3"].record.build_id
    assert len(build) == 8 and build != pipelines["rec"].record.build_id
    boundaries = [f"boundary1_{build}", f"boundary2_{build}"]
    assert [dict(s.input_map) for s in steps] == [{"image": "image"}, *({b: b} for b in boundaries)]
    assert dict(steps[-1].output_map) == {"logits": "logits"}
    embedding = read_config(repository / "rec_embedding" / "config.pbtxt")
    assert [i.name for i in embedding.input if i.optional] == ["sparse_ids", "update_table", "update_row",
                                                               "update_values"]  # fmt: skip


def test_a_wrong_split_is_caught_before_anything_is_written(spec: Spec) -> None:
    pipeline, model_spec = spec.pipeline("cls"), spec.model("image_classifier")
    model = build_torch_model(model_spec)
    stages, _ = make_stages(pipeline, model_spec, model)
    broken = [stages[0], type(stages[1])(**{**stages[1].__dict__, "module": torch.nn.Identity()})]
    sample = {"image": torch.randn(2, 3, 64, 64)}
    with pytest.raises(ExportCheckError, match="stages in sequence"):
        check_stages(broken, lambda t: model(t["image"]), [sample], "fp32", "cls (stages in sequence)")


def _small_batch_spec(spec_data: dict[str, Any], max_batch_size: int) -> Spec:
    data = copy.deepcopy(spec_data)
    next(m for m in data["models"] if m["name"] == "recommender")["max_batch_size"] = max_batch_size
    data["pipelines"] = [PIPELINES[0]]
    return parse_spec(data)


@pytest.mark.parametrize("max_batch_size", [1, 2])
def test_a_model_with_a_small_max_batch_builds(spec_data, max_batch_size: int, tmp_path: Path) -> None:
    """The parity samples stay within the exported batch axis (torch.export rejects batch 3 > max 2)."""
    (item,) = build_pipelines(_small_batch_spec(spec_data, max_batch_size), tmp_path, num_gpus=0)
    assert item.record.artifact_max_rel_error <= 1e-4
    assert (tmp_path / "rec_embedding" / "1" / "stage.pt2").exists()


def test_an_export_failure_names_the_stage(tmp_path: Path) -> None:
    class DataDependent(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x if x.sum() > 0 else -x  # torch.export cannot trace a branch on data

    tensor = TensorSpec("x", "fp32", (4,))
    stage = Stage("cls_stage0", DataDependent(), (tensor,), tensor, "torch_export")
    with pytest.raises(StageExportError, match="stage cls_stage0: torch_export export failed"):
        export_stage(stage, (torch.randn(3, 4),), 8, tmp_path / "stage.pt2")


def test_a_failed_build_leaves_nothing_half_built(spec: Spec, tmp_path: Path, monkeypatch) -> None:
    served = tmp_path / "cls_stage0" / "1"  # an earlier build's stage folder: kept, only partials go
    served.mkdir(parents=True)
    (served.parent / "config.pbtxt").write_text("name: 'cls_stage0'\n")

    def broken_load(stage, path):
        raise StageExportError(f"stage {stage.name}: does not load back")

    monkeypatch.setattr(pipeline_build, "load_stage", broken_load)
    with pytest.raises(StageExportError, match="cls_stage0"):
        build_pipelines(spec, tmp_path, num_gpus=0, only=["cls"])
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "cls_stage0",
        "cls_stage0/1",
        "cls_stage0/config.pbtxt",
    ]


def test_a_latency_balanced_rebuild_keeps_the_recorded_cut(
    spec_data: dict[str, Any], tmp_path: Path, monkeypatch
) -> None:
    """A rebuild into the same repository reuses the recorded plan, whatever a new measurement says."""
    data = copy.deepcopy(spec_data)
    data["pipelines"] = [
        {"name": "lat", "model": "image_classifier", "split": "blocks", "balance": "latency"}
    ]
    spec = parse_spec(data)
    (first,) = build_pipelines(spec, tmp_path, num_gpus=0)
    plan = first.record.split_plan
    assert plan.cost_method == "latency" and plan.near_cuts[0] == plan.cuts and plan.reason
    assert (
        PipelineRecord.from_json(json.loads((tmp_path / "lat" / "pipeline.json").read_text())).split_plan
        == plan
    )

    other = (1,) if plan.cuts != (1,) else (9,)  # a measurement that would cut elsewhere
    costs = [1.0] * 10
    costs[0 if other == (1,) else 9] = 9.0  # that block alone balances the other nine, by far
    monkeypatch.setattr(splitter, "measure_latency", lambda *args, **kwargs: (costs, 0.0))
    pipeline, model_spec = spec.pipeline("lat"), spec.model("image_classifier")
    assert make_stages(pipeline, model_spec, build_torch_model(model_spec))[1].cuts == other
    (again,) = build_pipelines(spec, tmp_path, num_gpus=0)
    assert again.cached and again.record.split_plan == plan

    # a record written before the plan said why (no noise, near_cuts, tie_method, reason) is still read
    path = tmp_path / "lat" / "pipeline.json"
    record = json.loads(path.read_text())
    for key in ("noise", "near_cuts", "tie_method", "reason"):
        del record["split_plan"][key]
    path.write_text(json.dumps(record))
    (older,) = build_pipelines(spec, tmp_path, num_gpus=0)
    assert older.cached and older.record.split_plan.cuts == plan.cuts
