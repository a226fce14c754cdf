"""``make plan`` and shapes as served: for a model with a variable axis the plan's report and
``plan.json`` carry the tuner's shapes section (formed batches per length, bucket candidates and their
padding cost) measured on the verified pick, and the buckets it chose go into the planned spec where the
choice met the budget; a fixed-shape model gets no section and serves nothing more. A profile of fixed
figures stands in for a measured one; the section's own runs are the integration test's."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from exporters.errors import SpecError
from exporters.schema.models import Spec, parse_model
from perf.measure.engine import OurEngine
from perf.plan.document import plan_document, render
from perf.plan.overlay import plan_overlay, write_plan_overlay
from perf.plan.verify import plan_shapes
from perf.session.model import TUNE_WINDOWS
from perf.session.search import Evidence
from perf.session.shapes_section import HEADING, ShapesFigures
from tests.unit.perf.measure.test_shapes import SEQUENCE, model
from tests.unit.perf.plan.test_verify import planned

FIXED = {
    "name": "fixed", "source": SEQUENCE["source"], "max_batch_size": 8,
    "inputs": [{"name": "frames", "dtype": "fp32", "shape": [100, 16]}],
    "outputs": [{"name": "state", "dtype": "fp32", "shape": [32]}],
}  # fmt: skip
SECTION = [f"{HEADING}: b8 d1000 i1, poisson 40/s", "", "### 2 buckets: formed batches per length sent", ""]


def test_a_fixed_shape_model_gets_no_shapes_section_and_nothing_is_served(tmp_path: Path) -> None:
    fixed = parse_model(FIXED, "models[0]")
    steps: list[str] = []
    evidence: Evidence[str] = Evidence(10.0)
    shapes = plan_shapes(fixed, planned(), 40.0, OurEngine(), TUNE_WINDOWS, tmp_path, steps.append, evidence)
    assert shapes is None
    assert not steps and not list(tmp_path.iterdir()) and not evidence.runs  # no build, no server, no run


def test_a_split_pick_of_a_variable_length_model_says_why_it_is_not_measured(tmp_path: Path) -> None:
    result = planned()
    split = next(j for j in result.judged if j.strategy.kind != "data" and j.feasible)
    result = dataclasses.replace(result, chosen=split)
    steps: list[str] = []
    evidence: Evidence[str] = Evidence(10.0)
    shapes = plan_shapes(model(), result, 40.0, OurEngine(), TUNE_WINDOWS, tmp_path, steps.append, evidence)
    assert shapes is None and not evidence.runs
    assert steps == [
        f"shapes: not measured for {split.strategy.label} (the bucket runs serve the whole model)"
    ]


def test_the_report_holds_the_shapes_section_only_where_the_plan_measured_one(tmp_path: Path) -> None:
    saved = plan_document(planned(), [], [], 1.0)
    assert HEADING not in render(tmp_path, saved).read_text()
    saved = dataclasses.replace(saved, shapes=ShapesFigures(tuple(SECTION), (64, 200)))
    report = render(tmp_path, saved).read_text()
    assert report.index(HEADING) > report.index("## Every strategy")
    assert "### 2 buckets: formed batches per length sent" in report


def test_the_chosen_buckets_go_into_the_planned_spec_and_are_validated(tmp_path: Path) -> None:
    base_path = tmp_path / "models.yaml"
    document_ = {"models": [{**SEQUENCE, "buckets": [100, 200]}]}
    base_path.write_text(yaml.safe_dump(document_))
    spec = Spec(models=(model(buckets=[100, 200]),))
    result = planned()
    whole = next(j for j in result.judged if j.strategy.kind == "data" and j.strategy.precision == "fp32")
    assert whole.placement is not None

    def written(buckets: list[int] | None) -> tuple[int, ...]:
        overlay = plan_overlay(document_, spec, "seq", whole.strategy, whole.placement, False, buckets)
        return write_plan_overlay(base_path, overlay, tmp_path, "test").model("seq").buckets

    assert written([64, 200]) == (64, 200)
    assert written([]) == ()  # each request at its own length
    assert written(None) == (100, 200)  # the choice missed the budget: the spec's stay
    with pytest.raises(SpecError, match=r"buckets\[0\]: 300 exceeds"):
        written([300])
