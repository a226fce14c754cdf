"""Change a served recommender pipeline's parameters without stopping it: embedding rows by update
requests to the embedding stage, the dense network as a new, checked version folder that Triton's
model control loads without dropping requests."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from exporters.artifacts.records import read_record
from exporters.errors import SpecError
from exporters.pipelines.build import RECORD, PipelineRecord, make_stages
from exporters.pipelines.stages import check_stages, export_stage, load_stage
from exporters.schema.models import ModelSpec, PipelineSpec
from exporters.sources.load import build_torch_model
from exporters.zoo.recommender import Recommender
from python_backend.dtypes import DTYPES
from python_backend.torch_stage.embedding_rows import UPDATE_ROW, UPDATE_TABLE, UPDATE_VALUES


def embedding_update(table: int, rows: np.ndarray, values: np.ndarray) -> dict[str, np.ndarray]:
    """The inputs of one update request: ``rows`` of ``table`` take ``values`` (``[len(rows), D]``)."""
    rows = np.asarray(rows, dtype=np.int64).reshape(-1, 1)
    return {
        UPDATE_TABLE: np.full_like(rows, table),
        UPDATE_ROW: rows,
        UPDATE_VALUES: np.ascontiguousarray(values, dtype=np.float32).reshape(len(rows), -1),
    }


def publish_dense_version(
    pipeline: PipelineSpec, spec: ModelSpec, repository: Path, version: int, seed: int
) -> Recommender:
    """Export the dense stage of a recommender built with ``seed`` as ``version``; returns that model.
    Built in a hidden sibling folder and renamed into place only once it matches torch."""
    if pipeline.split != "embedding_dense":
        raise SpecError(f"{pipeline.name}.split", "only an embedding_dense pipeline has a dense stage")
    model = build_torch_model(dataclasses.replace(spec, seed=seed))
    record = read_record(repository / pipeline.name / RECORD)
    if record is None:
        raise SpecError(
            pipeline.name, f"no {RECORD} in {repository / pipeline.name}: build the pipeline first"
        )
    # The new version joins the served build: its input takes that build's boundary tensor name.
    stages, _ = make_stages(pipeline, spec, model, build_id=PipelineRecord.from_json(record).build_id)
    dense = stages[1]
    folder = repository / dense.name / str(version)
    if folder.exists():
        raise SpecError(f"{dense.name}.version", f"version {version} already exists in {folder.parent}")
    folder.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".partial-{version}-", dir=folder.parent))
    try:
        artifact = building / dense.artifact_name
        generator = torch.Generator().manual_seed(seed)
        batch = min(3, spec.max_batch_size)
        sample = {
            t.name: torch.randn(batch, *t.shape, generator=generator).to(DTYPES[t.dtype].torch_dtype())
            for t in dense.inputs
        }
        export_stage(dense, tuple(sample.values()), spec.max_batch_size, artifact)
        loaded = load_stage(dense, artifact)
        what = f"{dense.name} v{version}"
        check_stages([dense], lambda t: dense.module(*t.values()), [sample], "fp32", what, [loaded])
        building.chmod(0o755)  # mkdtemp makes it private; the server may run as another user
        building.rename(folder)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    assert isinstance(model, Recommender)
    return model
