"""Fault matrix rows 30 and 48: an outside ``.pt2`` that would run code runs it only in the sandbox.

Each crafted archive (``crafted_programs``) is a valid program made to run ``touch`` on three markers:
one in a folder the sandbox cannot see, one in the host's ``/tmp`` (the sandbox has its own), one in
the project's ``exporters`` package (bound read-only). The ways in: a legacy pickled entry (listed,
or shown to torch's zip reader only), a pre-2.8 archive, a shape expression ``sympify`` evaluates,
a guard in ``guards_code``, and two names FX pastes unescaped into the Python it compiles for
``forward``: a ``torch.cond`` subgraph's and a parameter's. Those two passed every check of the
archive (entries, zip layout, shape expressions) and ran their code in ``exporters build`` and in the
stage runner. Each archive goes to ``python -m exporters build`` (a model's ``torch_export`` source)
and ``python -m exporters init --torch-export``: no marker may appear, and each must answer with an
error naming the source or with a model converted to ONNX (the repository then holds no ``.pt2``).

Row 48: an archive put in a pipeline stage's place in a real server's repository (its config as the
build wrote it) is refused by the stage runner before torch reads it: the file is not the one whose
SHA-256 the build recorded; the untouched stage beside it loads.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import uuid
import zipfile
from pathlib import Path

import pytest
import yaml
from crafted_programs import VARIANTS, craft, linear_program, with_guard_code
from harness import orphans

from exporters.__main__ import main as exporters_main
from server import ServerOptions, TritonServer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EMBEDDING_STAGE = "recommender_pipeline_embedding"
STAGE_VARIANTS = ("legacy_weights", "sympy_expression", "two_central_directories")


def _entry() -> dict:
    """A spec entry for ``crafted.pt2`` (a [batch, 3] -> [batch, 2] program), its tensors listed."""
    return {
        "name": "crafted", "source": {"torch_export": "crafted.pt2"}, "max_batch_size": 8,
        "inputs": [{"name": "input", "dtype": "fp32", "shape": [3]}],
        "outputs": [{"name": "output", "dtype": "fp32", "shape": [2]}],
    }  # fmt: skip


@pytest.fixture()
def markers(tmp_path: Path):
    """Where the archive's code tries to write; each must still be absent afterwards."""
    token = uuid.uuid4().hex
    paths = [
        tmp_path / "pwned",
        Path(tempfile.gettempdir()) / f"pwned-{token}",
        ROOT / "exporters" / f"pwned-{token}",
    ]
    yield paths
    for path in paths:
        path.unlink(missing_ok=True)


def _made(variant: str, tmp_path: Path, markers: list[Path]) -> Path:
    target = " ".join(map(str, markers))
    valid = linear_program(tmp_path / "valid.pt2")
    if variant == "guard_code":
        return with_guard_code(valid, tmp_path / "crafted.pt2", target)
    return craft(variant, valid, tmp_path / "crafted.pt2", target)


@pytest.mark.parametrize("variant", [*VARIANTS, "guard_code"])
def test_build_and_init_never_run_an_archives_code_outside_the_sandbox(
    variant: str, markers: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv("COLUMNS", "1000")  # the CLI's console: one message, one line
    monkeypatch.setenv("TRITON_BATCHING_CACHE", str(tmp_path / "cache"))
    program = _made(variant, tmp_path, markers)
    spec = tmp_path / "models.yaml"
    spec.write_text(yaml.safe_dump({"models": [_entry()]}))
    repository = tmp_path / "repository"

    code = exporters_main(["build", "--spec", str(spec), "--repository", str(repository), "--gpus", "0"])
    built = capsys.readouterr().out
    assert [m for m in markers if m.exists()] == [], f"{variant}: the archive's code ran during the build"
    if code == 0:  # converted: the repository serves the ONNX, never the archive
        assert (repository / "crafted" / "1" / "model.onnx").is_file(), built
    else:
        assert "crafted.source.torch_export" in built, built
    assert list(repository.rglob("*.pt2")) == []

    code = exporters_main(["init", "--torch-export", str(program)])
    answer = capsys.readouterr().out
    assert [m for m in markers if m.exists()] == [], f"{variant}: the archive's code ran during init"
    assert (code == 0 and "torch_export:" in answer) or (code != 0 and "--torch-export" in answer), answer


@pytest.mark.parametrize(
    ("variant", "name"), [("cond_subgraph_name", "true_graph_0"), ("parameter_name", "lin.weight")]
)
def test_the_crafted_names_are_code_to_fx(variant: str, name: str, tmp_path: Path) -> None:
    """What the two name variants rely on, shown without loading them: the archive holds a name that
    FX's code generation turns into a call (``torch.fx.graph._format_target`` writes each part of a
    name into ``getattr(self, "…")`` unescaped)."""
    from torch.fx.graph import _format_target

    program = craft(variant, tmp_path / "unused.pt2", tmp_path / "crafted.pt2", tmp_path / "x")
    with zipfile.ZipFile(program) as archive:
        text = next(archive.read(n) for n in archive.namelist() if n.endswith("models/model.json")).decode()
    literals = re.findall(r'"((?:[^"\\]|\\.)*)"', text)  # every JSON string of the program
    crafted = sorted({json.loads(f'"{s}"') for s in literals if "system" in s and name.split(".")[0] in s})
    assert crafted, f"{variant}: no crafted name in the archive"
    code = _format_target("self", crafted[0])
    assert 'getattr(__import__("os"), "system")' in code and code.count("getattr(self") >= 1, code


def test_the_stage_runner_refuses_an_archive_in_a_stages_place(
    fault_repository: Path, tmp_path: Path
) -> None:
    """Each crafted archive as the embedding stage's ``stage.pt2``, its config as the build wrote it,
    beside an untouched copy: the untouched stage loads, each crafted one fails to load because it is
    not the file the build recorded, and none of their code runs."""
    repository = tmp_path / "repository"
    shutil.copytree(fault_repository / EMBEDDING_STAGE, repository / "stage_untouched")
    markers = {}
    for variant in STAGE_VARIANTS:
        folder = repository / f"stage_{variant}"
        shutil.copytree(fault_repository / EMBEDDING_STAGE, folder)
        markers[variant] = tmp_path / f"pwned_{variant}"
        program = folder / "1" / "stage.pt2"
        craft(variant, fault_repository / EMBEDDING_STAGE / "1" / "stage.pt2", program, markers[variant])
    for folder in repository.iterdir():
        config = folder / "config.pbtxt"
        config.write_text(config.read_text().replace(f'name: "{EMBEDDING_STAGE}"', f'name: "{folder.name}"'))
        (folder / "1" / "live_updates.wal").unlink(missing_ok=True)

    with TritonServer(ServerOptions(repository=repository, startup_timeout_s=240)) as server:
        assert sorted(server.failed_models) == sorted(f"stage_{v}" for v in STAGE_VARIANTS), (
            server.failed_models
        )
        for variant in STAGE_VARIANTS:
            reason = server.failed_models[f"stage_{variant}"]
            assert "is not the artifact this config was built with" in reason, server.describe_failures()
        assert not orphans(server)
    assert [v for v, marker in markers.items() if marker.exists()] == [], "a stage's code ran in the server"
