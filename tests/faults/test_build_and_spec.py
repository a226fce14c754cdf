"""Fault matrix: the build side. Row 7 (a truncated ``model.onnx`` is rebuilt, not reported "cached";
a model that fails to load does not stop the others and is named with its own log lines), row 10
(``max_batch_size`` and zoo option bounds), config typos, unsafe ONNX external data, and the spec's
own bounds (a YAML alias bomb, an ``onnx:`` source that is not ONNX)."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import yaml
from harness import PROTOCOLS, orphans, trivial_inputs, url

from client.connection import connect
from exporters.__main__ import main as exporters_main
from exporters.artifacts.onnx_files import check_external_data
from exporters.artifacts.records import file_sha256
from exporters.errors import ExportCheckError, SpecError
from exporters.onnx_export import export_onnx
from exporters.schema.models import parse_spec
from server import ServerError, ServerOptions, TritonServer
from server.launcher import python_shm_bytes

pytestmark = pytest.mark.integration


def _spec(spec_data: dict[str, Any], name: str, **changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(spec_data)
    data["models"] = [m for m in data["models"] if m["name"] == name]
    data["models"][0].update(changes)
    data.pop("pipelines", None)
    return data


def test_truncated_artifact_is_rebuilt_not_cached(spec_data, tmp_path: Path) -> None:
    spec = parse_spec(_spec(spec_data, "trivial")).model("trivial")
    first = export_onnx(spec, tmp_path / "1")
    assert not first.cached and first.file_sha256
    assert export_onnx(spec, tmp_path / "1").cached  # untouched: a real cache hit
    data = first.path.read_bytes()
    first.path.write_bytes(data[: len(data) // 2])
    again = export_onnx(spec, tmp_path / "1")
    assert not again.cached, "a truncated model.onnx was reported cached"
    assert again.path.read_bytes() == data
    onnx.checker.check_model(str(again.path))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"max_batch_size": 100_000_000}, "models[0].max_batch_size: must be <= 4096, got 100000000"),
        ({"options": {"width": -32, "num_classes": 10, "resolution": 64}},
         "models[0].options.width: must be a positive integer or a list of them, got -32"),
        ({"options": {"width": "wide"}},
         "models[0].options.width: must be a positive integer or a list of them, got 'wide'"),
        ({"max_batch_sise": 8}, "models[0].max_batch_sise: unknown field"),
        ({"inputs": [{"name": "image", "dtype": "fp32", "shape": [3, 64, 64], "range": [0, 1]}]},
         "models[0].inputs[0].range: is for integer tensors, image is fp32"),
    ],
    ids=["max_batch_size_1e8", "negative_width", "width_not_a_number", "typo", "range_on_floats"],
)  # fmt: skip
def test_spec_mistakes_are_named(spec_data, changes, message) -> None:
    with pytest.raises(SpecError) as error:
        parse_spec(_spec(spec_data, "image_classifier", **changes))
    assert message in str(error.value)


def test_a_full_batch_too_large_for_shared_memory_is_named(spec_data) -> None:
    """4096 images of 3×512×512 floats: 12 GiB per batch, refused before any shm is mapped."""
    changes = {
        "max_batch_size": 4096,
        "options": {"width": 8, "num_classes": 10, "resolution": 512},
        "inputs": [{"name": "image", "dtype": "fp32", "shape": [3, 512, 512]}],
    }
    with pytest.raises(SpecError, match=r"models\[0\]\.max_batch_size: a full batch of 4096 needs 12288 MiB"):
        parse_spec(_spec(spec_data, "image_classifier", **changes))


def test_config_typo_is_named_before_start(tmp_path: Path) -> None:
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.pbtxt").write_text('name: "broken"\nmax_batch_sise: 8\n')
    with pytest.raises(ServerError, match=r"broken/config.pbtxt: not a valid model config.*max_batch_sise"):
        python_shm_bytes(tmp_path)


def test_a_hand_written_config_with_a_huge_batch_is_refused_before_start(tmp_path: Path) -> None:
    """Row 10 for configs the spec never saw: max_batch_size 1e8 would map ~45 GiB of shm per stub."""
    (tmp_path / "huge").mkdir()
    (tmp_path / "huge" / "config.pbtxt").write_text(
        'name: "huge"\nbackend: "onnxruntime"\nmax_batch_size: 100000000\n'
        'input [{name: "x", data_type: TYPE_FP32, dims: [16]}]\n'
        'output [{name: "y", data_type: TYPE_FP32, dims: [16]}]\n'
    )
    with pytest.raises(ServerError, match=r"huge/config.pbtxt: a full batch of 100000000 needs 12207 MiB"):
        python_shm_bytes(tmp_path)


def test_external_data_outside_the_model_folder_is_refused(tmp_path: Path) -> None:
    tensor = onnx.numpy_helper.from_array(np.ones(4, np.float32), "weight")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    tensor.ClearField("float_data")
    tensor.ClearField("raw_data")
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", "../../etc/passwd"
    graph = onnx.helper.make_graph([], "g", [], [], initializer=[tensor])
    path = tmp_path / "model.onnx"
    onnx.save(onnx.helper.make_model(graph), str(path))
    with pytest.raises(ExportCheckError, match=r"points outside the model folder: '\.\./\.\./etc/passwd'"):
        check_external_data(path)


def test_a_model_that_fails_to_load_does_not_stop_the_others(fault_repository: Path, tmp_path: Path) -> None:
    """A truncated model.onnx beside a good model: the server starts, serves the good one, and names
    the broken one with its reason and its own log lines (Triton 2.51 alone exits: one bad model
    stopped all 13, with a log tail that did not name it)."""
    repository = tmp_path / "repository"
    shutil.copytree(fault_repository / "trivial", repository / "trivial")
    broken = repository / "trivial_truncated"
    shutil.copytree(fault_repository / "trivial", broken)
    config = broken / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "trivial"', 'name: "trivial_truncated"'))
    model = broken / "1" / "model.onnx"
    model.write_bytes(model.read_bytes()[:100])
    with TritonServer(ServerOptions(repository=repository, startup_timeout_s=180)) as server:
        assert list(server.failed_models) == ["trivial_truncated"]
        assert "INVALID_PROTOBUF" in server.failed_models["trivial_truncated"]
        report = server.describe_failures()
        assert "model 'trivial_truncated' failed to load" in report
        assert "failed to load 'trivial_truncated' version 1" in report  # its own log line
        for protocol in PROTOCOLS:
            client = connect(protocol, url(server, protocol))
            assert client.is_server_live() and client.is_model_ready("trivial")
            answer = client.infer("trivial", trivial_inputs(protocol)).as_numpy("y")
            assert np.array_equal(answer, np.full((1, 16), 2.0, np.float32))
            assert not client.is_model_ready("trivial_truncated")
        assert not orphans(server)
    assert not orphans(server)


def test_build_records_every_artifacts_hash(fault_repository: Path) -> None:
    """Each recorded hash is the sha256 of the file the repository serves (a rebuild trusts it)."""
    record = json.loads((fault_repository / "recommender_pipeline" / "pipeline.json").read_text())
    assert record["stages"]
    for stage in record["stages"]:
        artifact = fault_repository / stage["name"] / "1" / stage["artifact"]
        assert stage["sha256"] == file_sha256(artifact), stage["name"]
    export = json.loads((fault_repository / "recommender" / "1" / "export.json").read_text())
    assert export["file_sha256"] == file_sha256(fault_repository / "recommender" / "1" / "model.onnx")


LAUGHS = """
models:
  - name: laughs
    source: {python: "factory:make", path: "."}
    max_batch_size: 4
    inputs: [{name: x, dtype: fp32, shape: [4]}]
    outputs: [{name: y, dtype: fp32, shape: [4]}]
    options:
      a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]
      b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
      c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
      d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
      e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
      f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
      g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
      h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]
      i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h]
"""


def _cli(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str]:
    """``python -m exporters`` in-process; its console output on one line per message."""
    code = exporters_main(argv)
    return code, capsys.readouterr().out


def test_a_yaml_alias_bomb_is_a_spec_error_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Billion laughs in a factory's options: 1.8e9 values from 700 bytes. Refused by ``validate``
    (which passed it before) and by ``build`` (which grew to 5.2 GB), naming the alias that expands."""
    monkeypatch.setenv("COLUMNS", "1000")
    (tmp_path / "factory.py").write_text(
        "import torch\n\ndef make(**options):\n    return torch.nn.Identity()\n"
    )
    spec = tmp_path / "models.yaml"
    spec.write_text(LAUGHS)
    message = "models[0].options.i: expands to 1,797,873,"
    code, out = _cli(["validate", "--spec", str(spec)], capsys)
    assert (code, message in out) == (2, True), out
    code, out = _cli(
        ["build", "--spec", str(spec), "--repository", str(tmp_path / "repo"), "--gpus", "0"], capsys
    )
    assert (code, message in out) == (2, True), out
    with pytest.raises(SpecError, match=r"models\[0\]\.options\.i: expands to"):  # data not read by us
        parse_spec(yaml.safe_load(LAUGHS))
    spec.write_text(LAUGHS.split("      a: &a")[0] + "      a: &a [lol, *a]\n")  # an alias to itself
    code, out = _cli(["validate", "--spec", str(spec)], capsys)
    assert (code, "refers to itself (a recursive YAML alias)" in out) == (2, True), out


@pytest.mark.parametrize("listed", [False, True], ids=["tensors_read_from_the_file", "tensors_listed"])
@pytest.mark.parametrize("via_link", [False, True], ids=["path", "symlink"])
def test_an_onnx_source_that_is_not_onnx_is_a_spec_error_naming_field_and_file(
    listed: bool,
    via_link: bool,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``onnx: /etc/passwd`` (or a link to it) gave an unhandled protobuf ``DecodeError`` traceback."""
    monkeypatch.setenv("COLUMNS", "1000")
    location = "/etc/passwd"
    if via_link:
        (tmp_path / "model.onnx").symlink_to(location)
        location = "model.onnx"
    entry: dict[str, Any] = {"name": "mine", "source": {"onnx": location}, "max_batch_size": 4}
    if listed:
        entry |= {"inputs": [{"name": "x", "dtype": "fp32", "shape": [4]}],
                  "outputs": [{"name": "y", "dtype": "fp32", "shape": [4]}]}  # fmt: skip
    spec = tmp_path / "models.yaml"
    spec.write_text(yaml.safe_dump({"models": [entry]}))
    code, out = _cli(
        ["build", "--spec", str(spec), "--repository", str(tmp_path / "repo"), "--gpus", "0"], capsys
    )
    field = "mine.source.onnx" if listed else "models[0].source.onnx"
    assert code == 2, out
    assert f"spec error {field}: /etc/passwd is not an ONNX model (DecodeError" in out, out
