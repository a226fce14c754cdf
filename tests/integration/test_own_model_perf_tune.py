"""Your own model measured like the zoo: ``make perf SPEC=… MODELS=…`` runs the batching study on a model
of an outside spec (every mode, the latency-model fit, the report and plots), and ``make tune`` on a
model slow for real (a batch of 16 computes for well over the 80 ms budget) in a spec in another
folder with ``path: .`` finishes, proposes no batch whose compute alone exceeds the budget, and writes
a ``spec.tuned.yaml`` that builds from anywhere. Short settings: the pieces must fit; no figure is
asserted."""

from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path

import pytest
import yaml
from outcomes import tune_outcome

from exporters.repository import build_repository
from exporters.resolve import load_spec
from perf.cli import PerfSetup, main
from perf.measure.engine import MeasureSettings
from perf.model.grid import Grid
from perf.studies.framework import StudyContext
from perf.studies.profiles import get_profile
from perf.studies.report import write_report
from perf.studies.study import StudyRunner
from perf.studies.study_spec import spec_families
from perf.tune.cli import TuneSetup

# A hang guard, not a speed check: over three times the slowest test here (the tune of the slow
# model) on a loaded two-core host.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "own_model"
FACTORIES = ROOT / "tests" / "data" / "own_factories" / "factories.py"


def test_make_perf_measures_a_model_of_an_outside_spec(tmp_path: Path) -> None:
    project = tmp_path / "project"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("artifacts", "__pycache__"))
    spec = project / "models.yaml"
    data = yaml.safe_load(spec.read_text())
    data["models"] = [m for m in data["models"] if m["name"] == "tagger_python"]  # no artifacts needed
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    own = spec_families(spec, ["tagger_python"])
    profile = get_profile("smoke", perf_analyzer=False, families=("tagger_python",), spec_families=own)
    result = StudyRunner(StudyContext(profile, tmp_path, tmp_path / "work")).run()
    report = write_report(result, tmp_path).read_text()
    for heading in ("## tagger_python", "### Same arrivals for every mode", "### Latency model", "### Plots"):
        assert heading in report, heading
    for name in ("throughput_vs_concurrency", "p99_vs_throughput", "formed_batches", "latency_model"):
        png = tmp_path / f"tagger_python_{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
    for mode in profile.modes:
        assert (tmp_path / "configs" / f"tagger_python_{mode}" / "config.pbtxt").is_file()
        measured = result.families["tagger_python"].sweep[mode]
        assert measured and all(sum(r.ok for r in m.records) > 0 for m in measured), mode
    assert str(project) in (tmp_path / "study.yaml").read_text()  # the user's factory, found by path


SLOW_BUDGET_MS = 80.0  # a batch of 16 takes 170 ms or more on these 2 cores, quiet or busy
SLOW_GRID = Grid(delays_us=(0,), max_batches=(4, 16), instances=(1,), no_batching=False)


def test_make_tune_on_a_slow_model_of_an_outside_spec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, quick_windows: MeasureSettings
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(FACTORIES, project / "factories.py")
    entry = {
        "name": "slow", "source": {"python": "factories:slow", "path": "."}, "max_batch_size": 16,
        "options": {"layers": 24},
        "inputs": [{"name": "x", "dtype": "fp32", "shape": [64, 512]}],
        "outputs": [{"name": "y", "dtype": "fp32", "shape": [512]}],
    }  # fmt: skip
    (project / "models.yaml").write_text(yaml.safe_dump({"models": [entry]}, sort_keys=False))
    code = main([
        "tune", "--spec", str(project / "models.yaml"), "--model", "slow", "--p99-ms", f"{SLOW_BUDGET_MS:g}",
        "--engine", "ours", "--seconds", "0.9", "--shortlist", "0", "--reports", str(tmp_path / "reports"),
    ], PerfSetup(tune=TuneSetup(
        quick_grid=SLOW_GRID, workdir=tmp_path / "work",
        windows=dataclasses.replace(quick_windows, window_batches=3),  # windows of 3 of its largest batch
    )))  # fmt: skip
    (folder,) = (tmp_path / "reports").iterdir()
    saved = tune_outcome(code, folder, SLOW_BUDGET_MS)  # an answer a run held, or a run over the budget
    if saved is None:
        return
    assert (folder / "report.md").is_file() and not (folder / "partial.md").exists()
    # the probe measured what a batch costs, at most the spec's 16; nothing the prediction ranks
    # computes beyond the budget (a probe run can still answer: it was measured to hold the budget)
    fit = saved.probe.fits["1"]
    compute = lambda n: fit.t_ms + (n - 1) * fit.dt_ms  # noqa: E731
    assert compute(16) > SLOW_BUDGET_MS, "the factory is meant to be slow: a batch of 16 beyond the budget"
    probed = {int(m[1]) for run in saved.probe.runs if (m := re.match(r"max (\d+),", run.config))}
    assert probed == {16}  # the grid's largest, within the spec's max_batch_size
    sizes = {int(re.match(r"max (\d+),", c.config)[1]) for c in saved.candidates if c.config[:4] == "max "}
    assert 16 not in sizes and all(compute(n) <= SLOW_BUDGET_MS for n in sizes)
    tuned = yaml.safe_load((folder / "spec.tuned.yaml").read_text())
    assert tuned["models"][0]["source"]["path"] == str(project)
    assert tuned["models"][0]["max_batch_size"] in sizes | probed
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    built = build_repository(load_spec(folder / "spec.tuned.yaml"), tmp_path / "again", num_gpus=0)
    assert [b.spec.name for b in built] == ["slow"]
