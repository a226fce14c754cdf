"""``make plan`` end to end at tiny settings: on this CPU (the pick verified on the real server) and on
a recorded GPU machine (placement, headroom flags, the overlay), through the command's own entry point.

Nothing here holds a rate, a p99 or a memory figure to a number, nor whether a loaded host lets the
budget be met: on this CPU ``make plan`` must answer with a point a run held the budget at or say
nothing meets naming a run over it (``outcomes``). The planner's choices are checked where the truth is
known, on hand-built profiles (tests/unit/perf/plan/test_placement.py,
tests/unit/perf/model/test_tandem.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from outcomes import plan_outcome
from rich.console import Console

from exporters.configs.models import build_model_config
from exporters.schema.models import parse_spec
from perf.cli import parser
from perf.errors import NothingMeetsError
from perf.measure.engine import MeasureSettings
from perf.plan.cli import THE_SETUP, PlanSetup, command_plan
from perf.plan.document import PlanDocument, render
from perf.plan.strategy import PRECISIONS
from perf.saved import load_document

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "models.yaml"
MODEL = "recommender"
BUDGET_MS = 100.0
# The smallest plan: one instance count, one delay, short measurements and predictions.
TINY = ["--instances", "1", "--delays-us", "0", "--seconds", "0.6", "--predict-s", "1"]
SECTIONS = ("## Placement", "## Every strategy")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One build folder for the module: the second plan reuses the first one's exports."""
    return tmp_path_factory.mktemp("plan-work")


def run_plan(
    reports: Path, workdir: Path, *options: str, budget_ms: float = BUDGET_MS, setup: PlanSetup = THE_SETUP
) -> tuple[PlanDocument, Path]:
    """``python -m perf plan`` as ``make plan`` runs it; the report folder's ``plan.json`` read back,
    and the folder. On this CPU the outcome is what the tool must make of its runs (``outcomes``): an
    answer, or the verdict (then this returns the verdict's document and the caller stops)."""
    argv = ["plan", "--spec", str(SPEC), "--model", MODEL, "--p99-ms", f"{budget_ms:g}", *TINY, *options]
    args = parser().parse_args([*argv, "--reports", str(reports), "--workdir", str(workdir)])
    try:
        code = command_plan(args, Console(width=200), setup)
    except NothingMeetsError:
        code = 3
    (folder,) = reports.glob("*-plan")
    if "--topology" not in options:
        saved = plan_outcome(code, folder, budget_ms)
        if code == 3:
            return saved, folder
    assert code == 0
    for name in ("plan.json", "report.md", "p99_vs_rate.png", "overlay.yaml", "spec.planned.yaml"):
        assert (folder / name).is_file(), name
    return load_document(folder / "plan.json", PlanDocument), folder


def check_common(saved: PlanDocument, folder: Path) -> dict[str, Any]:
    """What every plan holds, on any machine; returns the planned spec document."""
    chosen = saved.chosen
    assert saved.model == MODEL and saved.verdict is None and saved.overlay_written
    assert chosen.precision in PRECISIONS and chosen.reason == ""
    assert chosen.rate > 0 and chosen.p99_ms <= saved.budget_ms  # predicted within the budget (tiny model)
    assert chosen == saved.strategies[0]
    assert all(s.reason for s in saved.strategies[1:])  # every loser says why
    assert saved.placement and saved.routing and saved.compute_source
    written = json.loads((folder / "plan.json").read_text())  # the file's own shape, beyond the types
    for entry in written["placement"]:
        assert set(entry) == {"model", "replica", "stage", "gpus", "instances"}
    assert all(isinstance(row["met"], bool) for row in written["verification"])
    report = (folder / "report.md").read_text()
    assert f"Chosen: **{chosen.label}**: " in report and saved.compute_origin in report
    assert all(section in report for section in SECTIONS)
    assert render(folder, saved).read_text() == report  # the report again, from plan.json alone
    planned = yaml.safe_load((folder / "spec.planned.yaml").read_text())
    spec = parse_spec(planned, ROOT)  # the overlay passes the spec's own checks
    overlay = yaml.safe_load((folder / "overlay.yaml").read_text())
    return {"spec": spec, "overlay": overlay, "report": report}


def test_make_plan_on_this_cpu_picks_places_and_verifies_on_the_server(
    workdir: Path, tmp_path: Path, quick_windows: MeasureSettings
) -> None:
    # A budget the server holds at some rate even on a busy host: the answer is what it measured, and a
    # plan whose verification held the budget nowhere would end "nothing meets" (exit 3) instead.
    saved, folder = run_plan(
        tmp_path, workdir, "--no-split", "--probe-runs", "0", "--verify", "1", budget_ms=2000.0,
        setup=PlanSetup(windows=quick_windows),
    )  # fmt: skip
    if saved.verdict:  # no point held the budget on this host (``outcomes`` checked the verdict)
        return
    checked = check_common(saved, folder)
    assert saved.topology.name == "cpu" and saved.topology.gpus == ()
    assert {s.precision for s in saved.strategies} == set(PRECISIONS)
    assert {s.kind for s in saved.strategies} == {"data"}  # --no-split
    (entry,) = saved.placement
    assert entry.gpus == () and entry.instances == 1 and saved.server_flags == ()
    # The pick was searched on the server, and the rate the plan answers with is the highest a point of
    # it held the budget at (``outcomes``).
    rows = saved.verification
    assert rows and {r.strategy for r in rows} == {saved.chosen.label}
    assert all(r.measured_throughput > 0 for r in rows if r.verdict == "holds")
    assert "## Predicted vs measured on this machine" in checked["report"]
    # The overlay names the served model, which builds into a valid config for the CPU.
    (planned,) = checked["overlay"]["models"]
    assert planned["name"] == entry.model and planned["instances"] == {"cpu": 1}
    config = build_model_config(checked["spec"].model(entry.model), 0)
    assert [(g.kind, g.count) for g in config.instance_group] == [("KIND_CPU", 1)]


def test_make_plan_on_a_recorded_dgx1_places_with_headroom_and_nvlink_boundaries(
    workdir: Path, tmp_path: Path
) -> None:
    saved, folder = run_plan(tmp_path, workdir, "--topology", "dgx1-v100")
    checked = check_common(saved, folder)
    assert saved.topology.name == "dgx1-v100" and len(saved.topology.gpus) == 8
    assert saved.verification == () and saved.measured_rate is None  # not this host: nothing served
    used = sorted({g for entry in saved.placement for g in entry.gpus})
    assert used and set(used) <= set(range(8))
    assert saved.server_flags == tuple(f"--model-load-gpu-limit={g}:0.80" for g in used)
    splits = [s for s in saved.strategies if s.kind != "data"]
    assert {s.kind for s in splits} == {"pipeline", "hybrid"}
    for strategy in splits:  # each replica's boundary on an NVLink pair, never across SYS
        for links in strategy.links:
            assert links and all(label.startswith("NV") for label in links), strategy
    overlay = checked["overlay"]
    if saved.chosen.kind == "data":
        (planned,) = overlay["models"]
        assert planned["instances"]["gpus"] == used
    else:
        stages = {(e.replica, e.stage): e.gpus[0] for e in saved.placement}
        for replica, pipeline in enumerate(overlay["pipelines"]):
            assert pipeline["gpus"] == [stages[replica, k] for k in range(len(pipeline["gpus"]))]
