"""Shapes as served on the real server: a masked mean over sequences of 10-200 frames (padding with
the mask at 0 leaves its answer as it was), measured by the shapes study of ``make perf`` at one
length, at the lengths its sampler draws and padded to bucket candidates. The report names the lengths
sent, holds the formed batches per length and the padding cost of each bucketed run, and both the
one-length and the varied rates; ``make tune`` runs the same bucket section on its answer and carries
the chosen buckets into its merged spec where the choice met the budget. ``make plan`` on the
Conv1d+GRU, whose answer padding changes, offers no buckets and says why. No direction is asserted
between runs (host noise can flip a small difference), nor whether a loaded host lets the budget be
met: the tune and plan tests assert what the tool must do with the runs it got (``outcomes``). Short
settings, no figure judged."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import yaml
from outcomes import plan_outcome, tune_outcome
from rich.console import Console

from perf.cli import parser
from perf.errors import NothingMeetsError
from perf.measure.bucket_runs import ONE_LENGTH
from perf.measure.engine import MeasureSettings
from perf.model.grid import Grid
from perf.plan.cli import PlanSetup, command_plan
from perf.session.shapes_section import HEADING
from perf.studies.framework import StudyContext
from perf.studies.profiles import get_profile
from perf.studies.shape_study import ShapeStudy
from perf.studies.study_spec import spec_families
from perf.tune.cli import TuneSetup, command_tune

# A hang guard, not a speed check: over three times the slowest test here (make plan's shapes step)
# on a loaded two-core host.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]
FACTORIES = Path(__file__).resolve().parents[1] / "data" / "own_factories"
sys.path.insert(0, str(FACTORIES))
from entries import gru_entry, masked_entry  # noqa: E402

ENTRY, GRU = masked_entry(), gru_entry()


def test_the_shapes_study_reports_formed_batches_per_length_and_padding(tmp_path: Path) -> None:
    spec = tmp_path / "models.yaml"
    spec.write_text(yaml.safe_dump({"models": [ENTRY]}, sort_keys=False))
    families = spec_families(spec, ["sequence"])
    profile = get_profile("smoke", perf_analyzer=False, families=("sequence",), spec_families=families)
    study, steps = ShapeStudy(), []
    report = study.run(StudyContext(profile, tmp_path, tmp_path / "work", spec, progress=steps.append))
    assert len(steps) == study.steps(profile)  # the progress bar's count: every step the study took
    text = report.path.read_text()
    figures = json.loads((tmp_path / "shapes.json").read_text())["sequence"]
    runs = {run["name"]: run for run in figures["runs"]}
    assert {ONE_LENGTH, "exact lengths", "2 buckets"} <= set(runs), list(runs)
    assert all(run["failed"] == 0 and run["throughput"] > 0 for run in runs.values())
    # both rates are in the report; the one-length run is one row, the varied ones many
    assert runs[ONE_LENGTH]["throughput"] != runs["exact lengths"]["throughput"]
    single = re.search(r"every request at (\d+)", text)
    assert (
        single
        and len(runs[ONE_LENGTH]["rows"]) == 1
        and runs[ONE_LENGTH]["rows"][0]["sent_length"] == int(single[1])
    )
    assert len(runs["exact lengths"]["rows"]) > 20  # the sampler's lengths, each its own shape
    # padded to two buckets: exactly two lengths sent, named in the per-length table, with a padding cost
    buckets = runs["2 buckets"]["buckets"]
    assert [row["sent_length"] for row in runs["2 buckets"]["rows"]] == buckets
    padding = runs["2 buckets"]["padding"]  # its accounting is the unit tests'; timings here are noisy
    assert padding["ratio"] > 0 and 0 < padding["padded_share"] < 1
    assert f"buckets {buckets}" in text and "### 2 buckets: formed batches per length sent" in text
    for length in buckets:
        assert re.search(rf"^\| {length} \| \d+-{length} \| \d+ \|", text, re.MULTILINE), length
    assert figures["pick"] in runs and figures["pick"] != ONE_LENGTH


TUNE_GRID = Grid(delays_us=(1_000,), max_batches=(8,), instances=(1,), no_batching=False)


def test_make_tune_measures_the_traffic_lengths_and_chooses_buckets(
    tmp_path: Path, quick_windows: MeasureSettings
) -> None:
    """What ``make tune`` must do with the runs it got: answer with a point a run held the budget at, or
    say nothing meets naming a run over it (a loaded host decides which, not this test). With an
    answer, the shapes step measured it at its rate and the tuned spec carries its choice only where
    that choice met the budget."""
    spec = tmp_path / "models.yaml"
    spec.write_text(yaml.safe_dump({"models": [ENTRY]}, sort_keys=False))
    args = parser().parse_args([
        "tune", "--spec", str(spec), "--model", "sequence", "--p99-ms", "500", "--rate", "200",
        "--engine", "ours", "--seconds", "0.9", "--shortlist", "0", "--reports", str(tmp_path / "reports"),
    ])  # fmt: skip
    setup = TuneSetup(quick_grid=TUNE_GRID, workdir=tmp_path / "work", windows=quick_windows)
    try:
        code = command_tune(args, Console(quiet=True), setup=setup)
    except NothingMeetsError:
        code = 3
    (folder,) = (tmp_path / "reports").iterdir()
    saved = tune_outcome(code, folder, 500.0)
    if saved is None:
        return
    report = (folder / "report.md").read_text()
    section = report[report.index(HEADING) :]
    assert f"{saved.chosen}, " in section.splitlines()[0]  # measured on the answer
    assert "from 256 draws of factories:masked_sample" in section
    for run in ("one length (", "exact lengths", "2 buckets"):
        assert f"| {run}" in section, run
    (chosen,) = [line for line in section.splitlines() if "(chosen)" in line]
    assert not chosen.startswith("| one length")  # the one-length run is not the traffic
    tuned = yaml.safe_load((folder / "spec.tuned.yaml").read_text())["models"][0]
    if chosen.rstrip(" |").endswith("yes"):  # the choice met the budget: spec.tuned.yaml carries it
        assert chosen.split("|")[2].strip() == (str(tuned["buckets"]) if tuned["buckets"] else "–")
    else:  # no way met it: the spec's buckets stay, and the answer's point held once measured again
        assert "buckets" not in tuned and saved.buckets is None and saved.operating.runs >= 2
    assert "### 2 buckets: formed batches per length sent" in section
    assert re.search(r"^\| \d+ \| \d+-\d+ \| \d+ \|", section, re.MULTILINE)  # a bucket's row of true lengths


def test_make_plan_offers_no_buckets_for_a_model_whose_answer_padding_changes(
    tmp_path: Path, quick_windows: MeasureSettings
) -> None:
    """As for ``make tune``: an answer at a point that held the budget, or the verdict; with an answer,
    the shapes section of the pick at its measured rate offers no bucket set (padding changes the GRU's
    answer) and says why, and the planned spec carries ``buckets: []`` only where exact lengths met
    the budget."""
    spec = tmp_path / "models.yaml"
    spec.write_text(yaml.safe_dump({"models": [GRU]}, sort_keys=False))
    args = parser().parse_args([
        "plan", "--spec", str(spec), "--model", "sequence", "--p99-ms", "500", "--no-split",
        "--instances", "1", "--delays-us", "1000", "--verify", "1", "--probe-runs", "2", "--seconds", "0.9",
        "--predict-s", "1", "--reports", str(tmp_path / "reports"), "--workdir", str(tmp_path / "work"),
    ])  # fmt: skip
    try:
        code = command_plan(args, Console(quiet=True), PlanSetup(windows=quick_windows))
    except NothingMeetsError:
        code = 3
    (folder,) = (tmp_path / "reports").iterdir()
    saved = plan_outcome(code, folder, 500.0)
    if code == 3:
        return
    report = (folder / "report.md").read_text()
    section = report[report.index(HEADING) :]
    assert saved.shapes and saved.shapes.section[0].startswith(HEADING) and section.startswith(HEADING)
    assert "| exact lengths" in section and "| 2 buckets" not in section and "| 4 buckets" not in section
    # why not, in the section: the length, the bucket it was padded to, the output and by how much
    (why,) = [line for line in section.splitlines() if line.startswith("Not offered, not measured")]
    assert re.search(
        r"2 buckets \[\d+, \d+\]: padding changes the answer: length \d+ padded to \d+: state moved", why
    )
    (chosen,) = [line for line in section.splitlines() if "(chosen)" in line]
    assert chosen.startswith("| exact lengths (chosen)")  # the only way offered that is the traffic
    (entry,) = yaml.safe_load((folder / "overlay.yaml").read_text())["models"]  # sequence or a precision's
    models = yaml.safe_load((folder / "spec.planned.yaml").read_text())["models"]
    (planned,) = [m for m in models if m["name"] == entry["name"]]
    if chosen.rstrip(" |").endswith("yes"):  # exact lengths met the budget: the planned spec says so
        assert "`spec.planned.yaml` carries `buckets: []`" in section
        assert saved.shapes.buckets == () and planned["buckets"] == []
    else:  # no way met it: the spec's buckets stay
        assert saved.shapes.buckets is None and "buckets" not in planned
