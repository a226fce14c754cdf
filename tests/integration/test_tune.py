"""The tuner against a real tritonserver (explicit model control): the whole pipeline runs end to end
and its numbers add up, the report renders from the saved result, the overlay builds, a measurement
waits out the replaced instances.

Nothing here holds a latency, a throughput or a prediction to a figure, nor whether a loaded host lets
the budget be met: ``make tune`` must answer with a point a run held the budget at or say nothing meets
naming a run over it (``outcomes``). The tuner's pick is checked where the truth is known, against a
simulated server (tests/unit/perf/tune/test_tuner.py), and its outcome on a scripted one
(tests/unit/perf/tune/test_tuner_evidence.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from outcomes import tune_outcome
from rich.console import Console

from exporters.repository import build_repository
from exporters.resolve import load_spec
from perf.cli import parser
from perf.errors import NothingMeetsError
from perf.measure.engine import MeasureSettings, OurEngine
from perf.measure.measurement import Measurement
from perf.measure.noise import NoisePolicy
from perf.model.batcher import BatcherConfig
from perf.model.grid import Grid
from perf.session.model import ModelSession
from perf.session.probe import ProbePlan
from perf.spec_overlay import write_overlay
from perf.tune.cli import TuneSetup, command_tune
from perf.tune.report import render
from perf.tune.tuner import tune

pytestmark = pytest.mark.integration
SPEC = Path(__file__).resolve().parents[2] / "models.yaml"
MODEL = "recommender"
# Short runs: a test checks that the pieces fit, not what they measure.
SHORT = MeasureSettings(warmup_s=0.2, window_s=0.3, stable_windows=3, max_windows=3, p99_samples=10)
TINY = Grid(delays_us=(0, 2000), max_batches=(8,), instances=(1, 2), no_batching=False)
# A budget no stall of a busy host reaches: every candidate is feasible, so the pipeline runs whole.
BUDGET_MS = 5000.0


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelSession]:
    workdir = tmp_path_factory.mktemp("tune")
    noise = NoisePolicy(remeasure=False)
    with ModelSession(load_spec(SPEC), MODEL, 8, workdir, OurEngine(), SHORT, noise) as running:
        yield running


def runs_of(result) -> list[Measurement]:
    """Every run the tune's evidence holds (the probe's, the search's, the verification's)."""
    return [run for points in result.evidence.runs.values() for runs in points.values() for run in runs]


def test_a_measurement_starts_after_the_replaced_instances_have_exited(session: ModelSession) -> None:
    """``load_model`` returns while the replaced instances' stubs still run: a bare ``load`` leaves
    them running, ``prepare`` (what every measurement loads with) waits them out."""
    session.prepare(BatcherConfig(8, 0, instances=2))
    session.load(BatcherConfig(8, 500, instances=2))
    assert session.live_stubs() >= 2  # the new two; the replaced two may have exited by now, or not
    session.prepare(BatcherConfig(8, 1000, instances=1))
    assert session.live_stubs() == 1  # without the wait, replaced stubs would still be counted here


def test_the_written_overlay_validates_and_builds(session: ModelSession, tmp_path: Path) -> None:
    tuned = write_overlay(SPEC, session.base, BatcherConfig(16, 2000, instances=2), tmp_path, "test")
    build_repository(tuned, tmp_path / "repository", num_gpus=0, only=[MODEL])
    text = (tmp_path / "repository" / MODEL / "config.pbtxt").read_text()
    assert "max_queue_delay_microseconds: 2000" in text and "max_batch_size: 16" in text
    assert "count: 2" in text and "default_queue_policy" not in text


def test_make_tune_runs_end_to_end_and_its_numbers_add_up(
    tmp_path: Path, quick_windows: MeasureSettings
) -> None:
    """``python -m perf tune … --rate`` as ``make tune RATE=…`` runs it, on a grid of four candidates:
    probe → predict → search → answer → verify on the server, the saved result, the report rendered from
    it alone, the overlay built. One run, checked whole: every figure adds up, and the outcome is what
    the tool must make of its runs (``outcomes``), whichever a loaded host gives."""
    seen: dict = {}

    def tune_and_keep(server, request, plan=None, step=None, **kwargs):  # the CLI's tune, result kept
        seen["session"] = server
        seen["result"] = tune(server, request, ProbePlan(max_runs=4), step, **kwargs)
        return seen["result"]

    args = parser().parse_args([
        "tune", "--spec", str(SPEC), "--model", MODEL, "--p99-ms", f"{BUDGET_MS:g}", "--rate", "200",
        "--engine", "ours", "--seconds", "0.9", "--shortlist", "2", "--reports", str(tmp_path / "reports"),
    ])  # fmt: skip
    setup = TuneSetup(quick_grid=TINY, workdir=tmp_path / "work", windows=quick_windows, tuner=tune_and_keep)
    try:
        code = command_tune(args, Console(quiet=True), setup=setup)
    except NothingMeetsError:
        code = 3
    (folder,) = (tmp_path / "reports").iterdir()
    saved = tune_outcome(code, folder, BUDGET_MS)
    if saved is None:
        return
    result, session = seen["result"], seen["session"]
    assert set(result.probe.services) == {1, 2} and result.probe.saturation
    assert {r.config for r in result.ranking} == set(TINY.candidates(BUDGET_MS))
    assert result.evidence.best(at=200.0, prefer=[result.chosen]) == (result.chosen, 200.0)
    assert result.operating_point.config == result.chosen
    runs = runs_of(result)
    made = {id(run) for run in session.runs}
    assert runs and all(id(run) in made for run in runs)  # each one the session made
    assert session.noise.runs == len(session.runs)  # every run went through the noise policy, once counted
    for run in session.runs:  # every request sent ended as one record; the server counted the answered
        assert run.attempts == len(run.records)
        answered = sum(r.ok for r in run.records)
        assert run.server_total is not None and run.server_total.requests == answered, run.label
        assert run.server is not None and 0.0 <= run.stolen_share <= 1.0  # steal read for every run

    assert saved.chosen == result.chosen.label and saved.model_pick == result.ranking[0].config.label
    assert saved.target_rate == 200 and saved.operating_rate == 200 and saved.engine == "ours"
    assert all(point.rate == 200 for c in saved.shortlist for point in c.points[:1])  # from the target
    assert len(saved.verification) == len(result.points)
    assert len(saved.probe.runs) == len(result.probe.runs)
    for point, figures in zip(result.points, saved.verification, strict=True):
        assert figures.measured.sent == point.measured.figures.requests
        assert figures.measured.host_noise == session.noise.holds_noise(point.measured)
        assert figures.runs == len(result.evidence.of(point.config, point.rate))
    assert saved.seconds.make_tune >= saved.seconds.tuner and saved.raw  # the whole command; the raw backend
    overlay = (folder / "overlay.yaml").read_text()
    assert saved.chosen in overlay.splitlines()[0]  # the overlay says which pick it holds
    assert (folder / "repository" / MODEL / "config.pbtxt").is_file()
    report = render(folder).read_text()  # the report again, from the saved result alone
    assert f"Chosen: **{saved.chosen}**: holds p99 ≤ {BUDGET_MS:g} ms at the target" in report
    assert (folder / "p99_vs_rate.png").is_file()
