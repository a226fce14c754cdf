"""The stage runner without a server: only the artifact its build recorded loads, atomic row updates,
torch batching."""

from __future__ import annotations

import io
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from torch import nn

from exporters.artifacts.records import file_sha256
from python_backend.batching import InvalidInputError, TensorInfo, run_batched
from python_backend.torch_stage.embedding_rows import (
    UPDATE_ROW,
    UPDATE_TABLE,
    UPDATE_VALUES,
    apply_row_updates,
    check_ids,
)
from tests.unit.python_backend.fake_triton import FakeError, FakeRequest, forget_modules, load_model_module


class TouchesMarker:
    """Unpickling this creates a file: what an archive dropped in a stage's place could run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (Path.touch, (self.marker,))


@pytest.fixture()
def program(tmp_path: Path) -> Path:
    path = tmp_path / "stage.pt2"
    torch.export.save(torch.export.export(nn.Linear(3, 2).eval(), (torch.randn(2, 3),)), str(path))
    return path


def _with_legacy_pickle(source: Path, target: Path, marker: Path) -> Path:
    """``source`` plus the legacy ``data/weights/model.pt`` entry torch's loader would unpickle."""
    buffer = io.BytesIO()
    torch.save(TouchesMarker(marker), buffer)
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w") as new:
        prefix = old.namelist()[0].split("/")[0]
        for item in old.infolist():
            new.writestr(item, old.read(item.filename))
        new.writestr(f"{prefix}/data/weights/model.pt", buffer.getvalue())
    return target


def _tables() -> list[torch.Tensor]:
    return [torch.zeros(5, 2), torch.zeros(3, 2)]


def test_row_updates_apply_to_their_tables() -> None:
    tables = _tables()
    written = apply_row_updates(
        tables,
        torch.tensor([[0], [1], [0]]),
        torch.tensor([[4], [2], [0]]),
        torch.tensor([[1.0, 1], [2, 2], [3, 3]]),
    )
    assert written == 3
    assert (
        tables[0][4].tolist() == [1, 1]
        and tables[0][0].tolist() == [3, 3]
        and tables[1][2].tolist() == [2, 2]
    )


@pytest.mark.parametrize(
    ("table", "row", "values", "message"),
    [
        ([[0], [1]], [[1], [3]], [[1.0, 1], [1, 1]], "update_row"),  # row 3 is outside table 1
        ([[0], [2]], [[1], [0]], [[1.0, 1], [1, 1]], "update_table"),
        ([[0], [0]], [[1], [2]], [[1.0, 1], [float("nan"), 1]], "NaN"),
        ([[0]], [[1], [2]], [[1.0, 1]], "same rows"),
    ],
)
def test_a_bad_update_writes_nothing(table, row, values, message: str) -> None:
    tables = _tables()
    with pytest.raises(InvalidInputError, match=message):
        apply_row_updates(tables, torch.tensor(table), torch.tensor(row), torch.tensor(values))
    assert all(not t.any() for t in tables), "a rejected update must leave every table untouched"


def test_ids_outside_a_table_name_the_input_and_column() -> None:
    check_ids(torch.tensor([[4, 2]]), _tables(), "sparse_ids")
    with pytest.raises(InvalidInputError, match="'sparse_ids' column 1 holds id 3 outside table 1"):
        check_ids(torch.tensor([[4, 2], [0, 3]]), _tables(), "sparse_ids")


def test_run_batched_concatenates_torch_tensors_once() -> None:
    calls = []

    def double(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        calls.append(batch["x"].shape[0])
        return {"y": batch["x"] * 2}

    inputs = [TensorInfo("x", torch.float32, (2,))]
    requests = [
        {"x": torch.ones(1, 2)},
        {"x": torch.full((3, 2), 5.0)},
        {"x": torch.ones(1, 2, dtype=torch.float64)},
    ]
    results = run_batched(requests, inputs, double, concatenate=torch.cat)
    assert calls == [4]
    assert results[0]["y"].tolist() == [[2, 2]] and results[1]["y"].shape == (3, 2)
    assert isinstance(results[2], InvalidInputError) and "dtype" in str(results[2])


@pytest.fixture()
def stage_runner(monkeypatch: pytest.MonkeyPatch):
    """``torch_stage/model.py`` imported the way the stub imports it (its folder on ``sys.path``)."""
    before = set(sys.modules)
    yield load_model_module(monkeypatch, "torch_stage")
    forget_modules(before)


def _stage(stage_runner):
    model = stage_runner.TritonPythonModel()
    model.name, model.device = "rec_embedding", torch.device("cpu")
    return model


def test_the_recorded_artifact_loads_and_runs(stage_runner, program: Path) -> None:
    loaded, artifact = _stage(stage_runner)._program(str(program), file_sha256(program))
    assert artifact == file_sha256(program)
    assert loaded.module()(torch.randn(2, 3)).shape == (2, 2)


def test_another_archive_in_the_stages_place_is_refused_unread(
    stage_runner, program: Path, tmp_path: Path
) -> None:
    """A file that is not byte for byte the one the build recorded never reaches torch: its pickle,
    which ``torch.export.load`` would run, does not run."""
    marker = tmp_path / "pwned"
    crafted = _with_legacy_pickle(program, tmp_path / "crafted.pt2", marker)
    with pytest.raises(RuntimeError, match=r"is not the artifact this config was built with"):
        _stage(stage_runner)._program(str(crafted), file_sha256(program))
    assert not marker.exists()
    with pytest.raises(RuntimeError, match=r"records no stage_sha256"):
        _stage(stage_runner)._program(str(crafted), "")
    assert not marker.exists()


def _embedding_stage(stage_runner, tmp_path: Path):
    """The runner as ``initialize`` leaves an embedding stage over ``_tables()`` (no program file)."""
    model = stage_runner.TritonPythonModel()
    model.name, model.device = "rec_embedding", torch.device("cpu")
    model.inputs = [stage_runner.TensorInfo("sparse_ids", torch.int64, (2,))]
    model.output_names = ["embeddings"]
    model.tables = _tables()
    model.log = stage_runner.update_log.UpdateLog(str(tmp_path / "live_updates.wal"), model.tables)
    model.module = lambda ids: torch.stack([t[ids[:, i]] for i, t in enumerate(model.tables)], dim=1)
    return model


def test_a_failing_update_fails_alone(stage_runner, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    model = _embedding_stage(stage_runner, tmp_path)

    def broken(*args: object) -> int:
        raise RuntimeError("out of memory")

    monkeypatch.setattr(stage_runner, "apply_row_updates", broken)
    update = {UPDATE_TABLE: torch.tensor([[0]]), UPDATE_ROW: torch.tensor([[1]]),
              UPDATE_VALUES: torch.tensor([[1.0, 1.0]])}  # fmt: skip
    lookup = {"sparse_ids": torch.tensor([[4, 2]])}
    failed, answered = model.execute([FakeRequest(update), FakeRequest(lookup)])
    assert failed.error.code == FakeError.INTERNAL and "out of memory" in failed.error.message
    assert answered.error is None and answered.outputs["embeddings"].shape == (1, 2, 2)


def test_an_update_that_also_carries_ids_is_refused_naming_both(stage_runner, tmp_path: Path) -> None:
    """The lookup used to be dropped silently (the update answered alone): refused whole, with a 400."""
    model = _embedding_stage(stage_runner, tmp_path)
    mixed = {UPDATE_TABLE: torch.tensor([[0]]), UPDATE_ROW: torch.tensor([[1]]),
             UPDATE_VALUES: torch.tensor([[1.0, 1.0]]), "sparse_ids": torch.tensor([[4, 2]])}  # fmt: skip
    refused, answered = model.execute(
        [FakeRequest(mixed), FakeRequest({"sparse_ids": torch.tensor([[4, 2]])})]
    )
    assert refused.error.code == FakeError.INVALID_ARG
    assert all(
        name in refused.error.message for name in (UPDATE_TABLE, UPDATE_ROW, UPDATE_VALUES, "sparse_ids")
    )
    assert torch.equal(model.tables[0], _tables()[0]) and model.log.version == 0  # nothing applied or logged
    assert answered.error is None and answered.outputs["embeddings"].shape == (1, 2, 2)


def test_each_request_lists_its_inputs_once_and_lookups_batch_around_an_update(
    stage_runner, tmp_path: Path
) -> None:
    """The stage reads each request's inputs in one listing (Triton's lookup by name lists them all,
    every time), whether it updates or looks up; the lookups run as one batch, in request order."""
    model = _embedding_stage(stage_runner, tmp_path)
    for table in model.tables:  # distinct rows, so a lookup of the wrong row shows
        table.copy_(torch.arange(table.numel(), dtype=torch.float32).reshape(table.shape))
    tables = [table.clone() for table in model.tables]
    update = {UPDATE_TABLE: torch.tensor([[1]]), UPDATE_ROW: torch.tensor([[0]]),
              UPDATE_VALUES: torch.tensor([[9.0, 9.0]])}  # fmt: skip
    sent = [{"sparse_ids": torch.tensor([[1, 0]])}, update, {"sparse_ids": torch.tensor([[4, 2], [0, 0]])}]
    requests = [FakeRequest(inputs) for inputs in sent]
    first, updated, second = model.execute(requests)
    assert all(r.listings == 1 for r in requests)
    assert updated.error is None and updated.outputs["update_version"].tolist() == [[1]]
    tables[1][0] = 9.0  # the update is applied before the lookups of the same execute
    assert torch.equal(first.outputs["embeddings"], torch.stack([tables[0][[1]], tables[1][[0]]], dim=1))
    expected = torch.stack([tables[0][[4, 0]], tables[1][[2, 0]]], dim=1)
    assert torch.equal(second.outputs["embeddings"], expected)


def test_an_id_beyond_a_table_without_live_updates_is_the_clients_fault(stage_runner, tmp_path: Path) -> None:
    """A stage built without live updates has no tables to check ids against first: an id inside the
    declared range but beyond a smaller table reaches torch's lookup, whose ``IndexError`` is answered
    400 naming the input, not 500 (fault matrix row 63)."""
    model = _embedding_stage(stage_runner, tmp_path)
    tables, model.tables = model.tables, []  # no live updates: the lookup alone sees the tables' sizes
    model.module = lambda ids: torch.stack([t[ids[:, i]] for i, t in enumerate(tables)], dim=1)
    (refused,) = model.execute([FakeRequest({"sparse_ids": torch.tensor([[4, 3]])})])  # table 1 has 3 rows
    assert refused.error.code == FakeError.INVALID_ARG
    assert "input 'sparse_ids' holds a value the model rejects: IndexError" in refused.error.message
    (answered,) = model.execute([FakeRequest({"sparse_ids": torch.tensor([[4, 2]])})])
    assert answered.error is None and answered.outputs["embeddings"].shape == (1, 2, 2)
