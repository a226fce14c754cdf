"""Sources beyond the zoo without a server: each checked before it enters the repository, errors naming
model and field, the user's code in the content hash, inputs drawn from the spec, and ``init``."""

from __future__ import annotations

import sys
import warnings
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import onnx
import pytest
import torch
import yaml
from torch import nn

from exporters.errors import ExportCheckError, SpecError
from exporters.init.entry import entry_yaml, init_entry
from exporters.onnx_export import content_hash, export_onnx
from exporters.repository import build_repository
from exporters.resolve import resolve_spec
from exporters.schema.models import Spec, parse_spec
from exporters.sources.inputs import draw_inputs
from exporters.sources.load import build_torch_model, load_source


class Scorer(nn.Module):
    """Ids through an embedding table plus dense features: an int input with a findable range."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(50, 4)
        self.linear = nn.Linear(4 + 3, 2)

    def forward(self, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.linear(torch.cat([self.table(ids).sum(1), x], 1))


def _onnx(path: Path, dynamic_batch: bool = True) -> Path:
    torch.manual_seed(0)
    axes = {"ids": {0: "b"}, "x": {0: "b"}, "y": {0: "b"}} if dynamic_batch else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Scorer().eval(), (torch.zeros(2, 6, dtype=torch.long), torch.zeros(2, 3)), str(path),
            input_names=["ids", "x"], output_names=["y"], dynamic_axes=axes, opset_version=17, dynamo=False,
        )  # fmt: skip
    return path


def _resolved(data: dict[str, Any], base_dir: Path | None = None) -> Spec:
    """The spec as the build sees it: parsed, then the tensors left out read from the artifact."""
    return resolve_spec(parse_spec(data, base_dir))


def _entry(source: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"name": "mine", "source": source, "max_batch_size": 8, **fields}


def test_onnx_tensors_left_out_are_read_from_the_graph(tmp_path: Path) -> None:
    path = _onnx(tmp_path / "scorer.onnx")
    model = _resolved({"models": [_entry({"onnx": "scorer.onnx"})]}, base_dir=tmp_path).model("mine")
    assert [(t.name, t.dtype, t.shape, t.range) for t in model.inputs] == [
        ("ids", "int64", (6,), (0, 50)),  # the range from the embedding table it indexes
        ("x", "fp32", (3,), None),
    ]
    assert [(t.name, t.shape) for t in model.outputs] == [("y", (2,))]
    artifact = export_onnx(model, tmp_path / "repo")
    assert artifact.max_abs_error == 0.0 and onnx.load(str(artifact.path)).graph.input[0].name == "ids"
    assert path.exists() and artifact.path != path  # a copy in the repository; the user's file stays


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        (
            [{"name": "idz", "dtype": "int64", "shape": [6], "range": [0, 50]}],
            r"mine.inputs: the ONNX file also takes",
        ),
        (
            [
                {"name": "ids", "dtype": "int32", "shape": [6], "range": [0, 5]},
                {"name": "x", "dtype": "fp32", "shape": [3]},
            ],
            r"mine.inputs\[0\].dtype: is int32, the ONNX file says int64",
        ),
        (
            [
                {"name": "ids", "dtype": "int64", "shape": [7], "range": [0, 5]},
                {"name": "x", "dtype": "fp32", "shape": [3]},
            ],
            r"mine.inputs\[0\].shape: is \[7\], the ONNX file says \[6\]",
        ),
    ],
)
def test_onnx_signature_mismatch_names_model_and_field(tmp_path: Path, inputs: list, message: str) -> None:
    _onnx(tmp_path / "scorer.onnx")
    model = _resolved({"models": [_entry({"onnx": "scorer.onnx"}, inputs=inputs)]}, tmp_path).model("mine")
    with pytest.raises(SpecError, match=message):
        export_onnx(model, tmp_path / "repo")
    assert not (tmp_path / "repo" / "model.onnx").exists()


def test_onnx_with_a_fixed_batch_or_unsafe_external_data_is_refused(tmp_path: Path) -> None:
    _onnx(tmp_path / "fixed.onnx", dynamic_batch=False)
    with pytest.raises(
        SpecError, match=r"models\[0\].source.onnx: the model has no batch axis: input 'ids' is \[2, "
    ):
        _resolved({"models": [_entry({"onnx": "fixed.onnx"})]}, tmp_path)  # read when the spec is loaded
    tampered = onnx.load(str(_onnx(tmp_path / "scorer.onnx")))
    weight = tampered.graph.initializer[0]
    weight.ClearField("raw_data")
    weight.data_location = onnx.TensorProto.EXTERNAL
    weight.external_data.add(key="location", value="../../etc/passwd")
    onnx.save(tampered, str(tmp_path / "tampered.onnx"))
    with pytest.raises(SpecError, match=r"mine.source.onnx: .* points outside the model folder"):
        load_source(_resolved({"models": [_entry({"onnx": "tampered.onnx"})]}, tmp_path).model("mine"))


def test_fp16_from_an_fp32_onnx_file_is_half_and_held_to_the_file(tmp_path: Path) -> None:
    _onnx(tmp_path / "scorer.onnx")
    model = _resolved({"models": [_entry({"onnx": "scorer.onnx"}, precision="fp16")]}, tmp_path).model("mine")
    assert model.inputs[1].dtype == "fp16" and model.outputs[0].dtype == "fp16"
    artifact = export_onnx(model, tmp_path / "repo")
    graph = onnx.load(str(artifact.path)).graph
    assert graph.input[1].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    assert 0 < artifact.max_rel_error <= 2e-2


def _user_project(root: Path, body: str = "") -> Path:
    package = root / "proj" / "userpkg"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "nets.py").write_text(
        "import torch\nfrom torch import nn\n"
        "def make(width=4):\n    return nn.Sequential(nn.Linear(3, width), nn.Tanh())\n"
        "def not_a_module():\n    return 3\n" + body
    )
    return root / "proj"


def _python(root: Path, factory: str = "userpkg.nets:make", **fields: Any):
    entry = _entry(
        {"python": factory, "path": "proj"},
        inputs=[{"name": "x", "dtype": "fp32", "shape": [3]}],
        outputs=[{"name": "y", "dtype": "fp32", "shape": [fields.pop("width", 4)]}],
        **fields,
    )
    return _resolved({"models": [entry]}, root).model("mine")


@pytest.mark.parametrize(
    ("factory", "options", "message"),
    [
        ("userpkg.nope:make", {}, r"mine.source.python: cannot import 'userpkg.nope'"),
        ("userpkg.nets:missing", {}, r"mine.source.python: module 'userpkg.nets' has no 'missing'"),
        ("userpkg.nets:not_a_module", {}, r"mine.source.python: .* must return a torch.nn.Module, got int"),
        ("userpkg.nets:make", {"depth": 2}, r"mine.options: userpkg.nets:make does not take them"),
    ],
)
def test_factory_errors_name_model_and_field(
    tmp_path: Path, factory: str, options: dict, message: str
) -> None:
    _user_project(tmp_path)
    with pytest.raises(SpecError, match=message):
        load_source(_python(tmp_path, factory, options=options))


def test_the_users_source_files_count_in_the_content_hash(tmp_path: Path) -> None:
    _user_project(tmp_path)
    spec = _python(tmp_path, options={"width": 5}, width=5)
    first = content_hash(spec, load_source(spec))
    assert content_hash(spec, load_source(spec)) == first  # same code, same seed: same hash
    _user_project(tmp_path, body="# a comment changes the file, so the build must not be skipped\n")
    assert content_hash(spec, load_source(spec)) != first


def _zip_package(archive: Path, width_line: str) -> None:
    with zipfile.ZipFile(archive, "w") as bundle:
        bundle.writestr("zipped/__init__.py", "")
        bundle.writestr("zipped/width.py", width_line)


def test_a_module_imported_from_a_zip_under_the_folder_counts_in_the_content_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """A module of ``path`` imports a package from a zip archive there (``deps.zip/zipped/width.py`` is
    no file on disk): the archive is hashed, so an edit inside it rebuilds the model."""
    project = _user_project(tmp_path, body="import zipped.width  # from deps.zip\n").resolve()
    archive = project / "deps.zip"
    _zip_package(archive, "WIDTH = 4\n")
    monkeypatch.syspath_prepend(str(archive))  # as the user's own code or a .pth file would
    request.addfinalizer(lambda: [sys.modules.pop(name, None) for name in ("zipped", "zipped.width")])
    spec = _python(tmp_path)
    source = load_source(spec)
    assert sys.modules["zipped.width"].__file__ == str(archive / "zipped" / "width.py")
    assert archive in source.files
    first = content_hash(spec, source)
    _zip_package(archive, "WIDTH = 5  # an edit inside the archive\n")
    assert content_hash(spec, load_source(spec)) != first


def test_a_factory_from_a_zip_on_sys_path_without_a_path_hashes_its_archive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """No ``path``: the factory's own file counts, and for a factory in a zip archive that is the archive
    (``bundle.zip/zipnets.py`` is no file: hashing it failed)."""
    archive = tmp_path / "bundle.zip"
    factory = "import torch\nfrom torch import nn\ndef make():\n    return nn.Sequential(nn.Linear(3, 4))\n"
    with zipfile.ZipFile(archive, "w") as bundle:
        bundle.writestr("zipnets.py", factory)
    monkeypatch.syspath_prepend(str(archive))
    request.addfinalizer(lambda: sys.modules.pop("zipnets", None))
    entry = _entry(
        {"python": "zipnets:make"},
        inputs=[{"name": "x", "dtype": "fp32", "shape": [3]}],
        outputs=[{"name": "y", "dtype": "fp32", "shape": [4]}],
    )
    spec = _resolved({"models": [entry]}, tmp_path).model("mine")
    source = load_source(spec)
    assert source.files == [archive.resolve()]
    assert content_hash(spec, source)


def test_a_project_built_from_its_own_folder_hashes_only_its_own_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``path: .`` from inside the project: torch's modules with a relative ``__file__`` (``_classes.py``,
    ``_ops.py``) are not the user's, even where the project holds a file of that name (never imported);
    and a name under the folder that is no file cannot be hashed."""
    project = _user_project(tmp_path).resolve()
    (project / "_ops.py").write_text("")
    monkeypatch.chdir(project)
    gone = ModuleType("gone")
    gone.__file__ = str(project / "gone.py")
    monkeypatch.setitem(sys.modules, "gone", gone)
    spec = _python(tmp_path)
    source = load_source(spec)
    assert source.files == [project / "userpkg" / "__init__.py", project / "userpkg" / "nets.py"]
    content_hash(spec, source)  # reads every file it names


def test_inputs_drawn_from_the_spec_honour_range_lengths_and_bounds() -> None:
    entry = _entry(
        {"onnx": "unused.onnx"},
        inputs=[
            {"name": "ids", "dtype": "int64", "shape": [-1], "max_shape": [16], "range": [5, 9]},
            {"name": "mask", "dtype": "int64", "shape": [-1], "max_shape": [16], "range": [0, 2]},
            {"name": "x", "dtype": "fp32", "shape": [2]},
        ],
        outputs=[{"name": "y", "dtype": "fp32", "shape": [1]}],
        lengths=[3, 16],
    )
    spec = _resolved({"models": [entry]}).model("mine")
    seen = set()
    for seed in range(12):
        ids, mask, x = draw_inputs(spec, 4, seed)
        assert ids.shape == mask.shape and ids.shape[1] in (3, 16)  # one length shared by the inputs
        assert ids.min() >= 5 and ids.max() < 9 and set(np.unique(mask)) <= {0, 1}
        assert x.shape == (4, 2) and x.dtype == np.float32
        seen.add(ids.shape[1])
    assert seen == {3, 16}


def test_a_sample_function_that_breaks_the_spec_is_named(tmp_path: Path) -> None:
    _user_project(
        tmp_path, body="import numpy as np\ndef bad(batch, rng):\n    return {'x': np.zeros((batch, 4))}\n"
    )
    spec = _python(tmp_path, sample="userpkg.nets:bad")
    with pytest.raises(
        SpecError, match=r"mine.inputs\[0\].shape: sample function userpkg.nets:bad gives x shape"
    ):
        draw_inputs(spec, 2, 0)


def test_a_program_with_a_static_batch_is_refused(tmp_path: Path) -> None:
    program = torch.export.export(nn.Linear(3, 2), (torch.zeros(2, 3),))
    torch.export.save(program, str(tmp_path / "static.pt2"))
    entry = _entry({"torch_export": "static.pt2"})
    with pytest.raises(
        SpecError, match=r"mine.source.torch_export: .*batch axis is static; export with a dynamic"
    ):
        export_onnx(_resolved({"models": [entry]}, tmp_path).model("mine"), tmp_path / "repo")


def test_init_output_validates_and_builds(tmp_path: Path) -> None:
    path = _onnx(tmp_path / "scorer.onnx")
    text = entry_yaml(init_entry("onnx", str(path), max_batch_size=4))
    spec = _resolved(yaml.safe_load(text))
    assert spec.model("scorer").inputs[0].range == (0, 50)
    built = build_repository(spec, tmp_path / "repo", num_gpus=0)
    assert built[0].artifact.max_abs_error == 0.0 and (tmp_path / "repo" / "scorer" / "config.pbtxt").exists()
    with pytest.raises(
        SpecError, match=r"--huggingface /nowhere: '/nowhere' is neither a folder nor an installed"
    ):
        init_entry("huggingface", "/nowhere")


def test_an_artifact_that_cannot_be_read_is_named_by_its_place_in_the_spec(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"^models\[0\]\.source\.onnx: no such file: .*nope\.onnx"):
        _resolved({"models": [_entry({"onnx": "nope.onnx"})]}, tmp_path)
    with pytest.raises(SpecError, match=r"^models\[0\]\.source\.torch_export: no such file"):
        _resolved({"models": [_entry({"torch_export": "nope.pt2"})]}, tmp_path)


def _scorer_program(path: Path) -> Path:
    torch.manual_seed(0)
    batch = torch.export.Dim("batch", min=1, max=64)
    example = (torch.zeros(2, 6, dtype=torch.long), torch.zeros(2, 3))
    program = torch.export.export(Scorer().eval(), example, dynamic_shapes=({0: batch}, {0: batch}))
    torch.export.save(program, str(path))
    return path


def test_a_torch_export_source_is_served_as_the_onnx_converted_in_the_sandbox(tmp_path: Path) -> None:
    """The signature is read in the sandbox (the id range from the embedding table too), the served
    file is the converted ONNX, and the torch module's own answer agrees with it."""
    program = _scorer_program(tmp_path / "scorer.pt2")
    spec = _resolved({"models": [_entry({"torch_export": "scorer.pt2"})]}, tmp_path)
    model = spec.model("mine")
    assert [t.name for t in model.inputs] == ["ids", "x"] and model.inputs[0].range == (0, 50)
    built = build_repository(spec, tmp_path / "repo", num_gpus=0)
    served = tmp_path / "repo" / "mine" / "1" / "model.onnx"
    assert built[0].artifact.max_rel_error == 0.0 and list((tmp_path / "repo").rglob("*.pt2")) == []
    source = load_source(model)
    assert source.path.name == "model.onnx" and source.path.read_bytes() == served.read_bytes()
    inputs = source.inputs(3, seed=5)
    torch.manual_seed(0)
    expected = Scorer().eval()(*(torch.from_numpy(a) for a in inputs)).detach().numpy()
    np.testing.assert_allclose(source.reference(inputs)[0], expected, rtol=1e-5, atol=1e-6)
    assert program.read_bytes()  # the archive itself is untouched and never copied into the repository


def test_a_pipeline_cannot_split_a_torch_export_source(tmp_path: Path) -> None:
    """Refused when the spec is read, before anything opens the archive (none exists here)."""
    tensors = {"inputs": [{"name": "x", "dtype": "fp32", "shape": [3]}],
               "outputs": [{"name": "y", "dtype": "fp32", "shape": [2]}]}  # fmt: skip
    data = {
        "models": [_entry({"torch_export": "nowhere.pt2"}, **tensors)],
        "pipelines": [{"name": "mine_pipeline", "model": "mine", "split": "blocks", "stages": 2}],
    }
    with pytest.raises(
        SpecError, match=r"pipelines\[0\]\.model: .*opened only in the sandbox.*source: \{python"
    ):
        parse_spec(data, tmp_path)
    with pytest.raises(ExportCheckError, match="opened only in the sandbox"):
        build_torch_model(parse_spec({"models": data["models"]}, tmp_path).model("mine"))


class WritesMarker:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (Path.touch, (self.marker,))


def test_a_huggingface_folder_is_read_from_safetensors_only(tmp_path: Path) -> None:
    """A ``pytorch_model.bin`` is a pickle torch would deserialise: refused, never opened."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "bert", "vocab_size": 50, "hidden_size": 16}')
    marker = tmp_path / "pwned"
    torch.save({"weight": WritesMarker(marker)}, folder / "pytorch_model.bin")
    entry = _entry({"huggingface": str(folder)}, inputs=[{"name": "input_ids", "dtype": "int64", "shape": [4],
                                                           "range": [0, 50]}],
                   outputs=[{"name": "last_hidden_state", "dtype": "fp32", "shape": [4, 16]}])  # fmt: skip
    with pytest.raises(SpecError, match=r"mine\.source\.huggingface: .* has no safetensors weights"):
        load_source(_resolved({"models": [entry]}).model("mine"))
    assert not marker.exists()
