"""``exporters init`` for a factory at fp16, and what it says about the machine's cores."""

from __future__ import annotations

from pathlib import Path

import yaml

from exporters.init_entry import entry_yaml, init_entry, machine_hint
from exporters.onnx_export import export_onnx
from exporters.spec import parse_spec

FACTORIES = Path(__file__).resolve().parents[1] / "data" / "own_factories"


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


def test_init_says_what_the_defaults_leave_idle() -> None:
    hint = machine_hint(2)
    assert "2 usable cores" in hint and "instances: {cpu: 2}" in hint and "threads:\n# {intra_op: 2}" in hint
    assert all(line.startswith("#") for line in hint.splitlines())  # comments: the YAML stays the entry
    assert "1 usable core" in machine_hint(1)
