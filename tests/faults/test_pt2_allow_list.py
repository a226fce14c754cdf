"""Fault matrix row 30: a ``.pt2`` that would run code is refused, and the code never runs.

Each crafted archive (``crafted_programs``) is a valid program plus an entry torch 2.13 unpickles with
``weights_only=False`` (listed, or shown to torch's zip reader only: ``crafted_archives``), or a shape
expression its loader evaluates; the code runs ``touch <marker>``.
It is handed to ``python -m exporters build`` (a model's ``torch_export`` source), to ``python -m
exporters init --torch-export``, and to the stage runner inside a real server (as a pipeline stage's
``stage.pt2``). Each must refuse it with an error naming the entry, and the marker must never appear.
A guard in the program's ``guards_code`` (Python the exporter would run) is dropped, never run.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from crafted_archives import CONSTRUCTIONS
from crafted_programs import VARIANTS, craft, linear_program, with_guard_code
from harness import orphans

from exporters.__main__ import main as exporters_main
from exporters.file_hash import file_sha256
from server import ServerOptions, TritonServer

pytestmark = pytest.mark.integration

EMBEDDING_STAGE = "recommender_pipeline_embedding"
# The build and init take every zip construction too; the server, one of them (a stub each is slow).
BUILD_VARIANTS = VARIANTS + tuple(c for c in CONSTRUCTIONS if c not in VARIANTS)
REFUSALS = ("is not one that torch.export.save writes", "which is not a plain shape expression",
            "not a torch.export archive as torch.export.save lays it out")  # fmt: skip


def _entry() -> dict:
    """A spec entry for ``crafted.pt2`` (``crafted_programs.linear_program``), its tensors listed."""
    return {
        "name": "crafted", "source": {"torch_export": "crafted.pt2"}, "max_batch_size": 8,
        "inputs": [{"name": "input", "dtype": "fp32", "shape": [3]}],
        "outputs": [{"name": "output", "dtype": "fp32", "shape": [2]}],
    }  # fmt: skip


@pytest.mark.parametrize("variant", BUILD_VARIANTS)
def test_build_and_init_refuse_a_program_that_would_unpickle(
    variant: str, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # the CLI's console: one message, one line
    marker = tmp_path / "pwned"
    program = craft(variant, linear_program(tmp_path / "valid.pt2"), tmp_path / "crafted.pt2", marker)
    spec = tmp_path / "models.yaml"
    spec.write_text(yaml.safe_dump({"models": [_entry()]}))
    repository = tmp_path / "repository"

    code = exporters_main(["build", "--spec", str(spec), "--repository", str(repository), "--gpus", "0"])
    built = capsys.readouterr().out
    assert not marker.exists(), f"{variant}: the archive's code ran during the build"
    assert code == 2, built
    assert "crafted.source.torch_export: refused" in built and any(r in built for r in REFUSALS)
    assert not (repository / "crafted" / "1" / "model.onnx").exists()

    code = exporters_main(["init", "--torch-export", str(program)])
    assert not marker.exists(), f"{variant}: the archive's code ran during init"
    refused = capsys.readouterr().out
    assert code == 2 and any(r in refused for r in REFUSALS), refused


def test_guard_code_in_a_program_never_runs_at_build(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A program's ``guards_code`` strings are Python that ``module()`` executes by default; the build
    uses the program's module without them (the spec and the parity check hold it to its inputs)."""
    monkeypatch.setenv("COLUMNS", "1000")
    marker = tmp_path / "pwned"
    with_guard_code(linear_program(tmp_path / "valid.pt2"), tmp_path / "crafted.pt2", marker)
    spec = tmp_path / "models.yaml"
    spec.write_text(yaml.safe_dump({"models": [_entry()]}))
    code = exporters_main(
        ["build", "--spec", str(spec), "--repository", str(tmp_path / "repo"), "--gpus", "0"]
    )
    out = capsys.readouterr().out
    assert not marker.exists(), "the program's guard code ran during the build"
    assert code == 0 and (tmp_path / "repo" / "crafted" / "1" / "model.onnx").is_file(), out


def test_the_stage_runner_in_the_server_refuses_them(fault_repository: Path, tmp_path: Path) -> None:
    """Each crafted archive as the embedding stage's ``stage.pt2``, beside an untouched copy: the
    untouched stage loads (the runner is not refusing everything), each crafted one fails to load with
    the refusal as its reason, and none of their pickles runs."""
    repository = tmp_path / "repository"
    shutil.copytree(fault_repository / EMBEDDING_STAGE, repository / "stage_untouched")
    markers = {}
    for variant in VARIANTS:
        folder = repository / f"stage_{variant}"
        shutil.copytree(fault_repository / EMBEDDING_STAGE, folder)
        markers[variant] = tmp_path / f"pwned_{variant}"
        program = folder / "1" / "stage.pt2"
        craft(variant, fault_repository / EMBEDDING_STAGE / "1" / "stage.pt2", program, markers[variant])
    built_with = file_sha256(fault_repository / EMBEDDING_STAGE / "1" / "stage.pt2")
    for folder in repository.iterdir():
        config = folder / "config.pbtxt"
        text = config.read_text().replace(f'name: "{EMBEDDING_STAGE}"', f'name: "{folder.name}"')
        # Whoever can write stage.pt2 can write its config too: the allow-list, not the hash, must refuse.
        config.write_text(text.replace(built_with, file_sha256(folder / "1" / "stage.pt2")))
        (folder / "1" / "live_updates.wal").unlink(missing_ok=True)

    with TritonServer(ServerOptions(repository=repository, startup_timeout_s=240)) as server:
        assert sorted(server.failed_models) == sorted(f"stage_{v}" for v in VARIANTS), server.failed_models
        for variant in VARIANTS:
            reason = server.failed_models[f"stage_{variant}"]
            assert any(r in reason for r in REFUSALS), server.describe_failures()
        assert not orphans(server)
    assert [v for v, marker in markers.items() if marker.exists()] == [], "a stage's code ran in the server"
