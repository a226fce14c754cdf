"""``plan.json`` is the report's whole record: the plan's document written and read back renders the
same ``report.md`` as the one built, the verdict's included, and a file with a field of the wrong type
is refused naming the field. A profile of fixed figures stands in for a measured one."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from perf.errors import OptionError
from perf.plan.document import GpuFigures, PlanDocument, plan_document, render, top_architectures
from perf.saved import load_document, save_document
from perf.session.shapes_section import ShapesFigures
from tests.unit.perf.plan.test_shapes import SECTION
from tests.unit.perf.plan.test_verify import planned, row


def built(verdict: str | None) -> PlanDocument:
    result = planned()
    first, second = top_architectures(result, 2)
    rows = [row(first, 0.7, 6.0), row(first, 1.0, math.inf, sustained=False), row(second, 0.7, 12.0)]
    if verdict:
        return plan_document(result, (), rows, 2.5, verdict=verdict)
    return plan_document(
        result, ["--model-load-gpu-limit=0:0.80"], rows, 2.5, measured_rate=rows[0].rate,
        overlay_written=True, shapes=ShapesFigures(tuple(SECTION), (64, 200)),
    )  # fmt: skip


@pytest.mark.parametrize("verdict", [None, "nothing meets p99 <= 10 ms here: the closest measured was …"])
def test_a_saved_plan_read_back_renders_the_report_it_was_built_with(
    verdict: str | None, tmp_path: Path
) -> None:
    saved = built(verdict)
    back = load_document(save_document(tmp_path / "plan.json", saved), PlanDocument)
    assert back == saved
    (tmp_path / "built").mkdir()
    (tmp_path / "read").mkdir()
    report = render(tmp_path / "built", saved).read_text()
    assert render(tmp_path / "read", back).read_text() == report
    assert ("**No answer" in report) == bool(verdict)


def test_a_plan_json_with_a_field_of_the_wrong_type_is_refused_naming_it(tmp_path: Path) -> None:
    path = save_document(tmp_path / "plan.json", built(None))
    data = json.loads(path.read_text())
    data["chosen"]["rate"] = "fast"
    path.write_text(json.dumps(data))
    with pytest.raises(OptionError, match=r"not a PlanDocument document: chosen\.rate"):
        load_document(path, PlanDocument)


def test_a_plan_json_that_still_carries_a_dropped_figure_reads_back(tmp_path: Path) -> None:
    """A file written while each GPU of the topology still carried ``used_mib`` (nothing read it) loads
    as the same document: the keys a type no longer has are passed over, not refused."""
    gpus = (GpuFigures(0, "NVIDIA H200", 143771.0), GpuFigures(1, "NVIDIA H200", 143771.0))
    saved = built(None)
    saved = dataclasses.replace(saved, topology=dataclasses.replace(saved.topology, gpus=gpus))
    path = save_document(tmp_path / "plan.json", saved)
    data = json.loads(path.read_text())
    for gpu in data["topology"]["gpus"]:
        gpu["used_mib"] = 2815.0
    path.write_text(json.dumps(data))
    assert load_document(path, PlanDocument) == saved


def test_a_built_plan_cannot_be_changed_after_the_fact() -> None:
    saved = built(None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        saved.verdict = "changed"  # type: ignore[misc]


def test_a_plan_for_a_pipeline_is_titled_by_the_pipeline(tmp_path: Path) -> None:
    saved = dataclasses.replace(built(None), asked="recommender_pipeline")
    assert saved.model == "recommender"  # the model it splits: the profile's
    title = render(tmp_path, saved).read_text().splitlines()[0]
    assert title.startswith("# Plan: recommender_pipeline (a pipeline splitting recommender), p99 ≤")
    assert render(tmp_path, built(None)).read_text().startswith(f"# Plan: {saved.model}, p99")


def test_the_strategy_table_labels_the_prediction_and_gives_the_pick_its_measured_rate(
    tmp_path: Path,
) -> None:
    """The table of every strategy holds the prediction's figures: labelled so, with "none" where no rate
    was predicted within the budget, and the pick's row gives the rate the server measured it to hold
    the budget up to (a pick predicted over the budget read "0" beside "chosen")."""
    saved = built(None)
    saved = dataclasses.replace(saved, chosen=dataclasses.replace(saved.chosen, rate=0.0))
    saved = dataclasses.replace(
        saved,
        strategies=tuple(saved.chosen if s.label == saved.chosen.label else s for s in saved.strategies),
    )
    report = render(tmp_path, saved).read_text()
    assert "| strategy | predicted rate/s | predicted p99 ms |" in report
    row = next(line for line in report.splitlines() if line.startswith(f"| {saved.chosen.label} |"))
    assert row.startswith(f"| {saved.chosen.label} | none |")
    assert f"chosen (measured within the budget up to {saved.measured_rate:,.0f}/s)" in row
