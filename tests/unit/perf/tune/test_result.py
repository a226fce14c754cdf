"""The tuner's ``result.json`` is its typed document written out: a tune on the simulated server, saved
and read back, is the same ``TuneDocument`` and renders the same report; what is added to it
(sections, the raw backend, buckets) reads back too; and a file that is not a
tune result is refused in one line naming the field, by ``python -m perf.tune.report`` with status 2."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from perf.errors import EXIT_USAGE, OptionError
from perf.measure.raw import RawPoint
from perf.session.probe import ProbePlan
from perf.tune import report
from perf.tune.result import RESULT_FILE, TuneDocument, document, load, save
from perf.tune.tuner import TuneRequest, tune
from tests.unit.perf.scripted_server import ScriptedServer
from tests.unit.perf.simulated_server import Noise
from tests.unit.perf.tune.test_tuner import BUDGET_MS, GRID, LINEAR
from tests.unit.perf.tune.test_tuner_evidence import by_family, remeasured


@pytest.fixture(scope="module")
def built() -> TuneDocument:
    """A whole tune's document: an answer a later run refuted (reopened), runs the noise policy measured
    again (the simulated host's steal), and what the tools beside it add."""
    server = ScriptedServer(LINEAR, BUDGET_MS, by_family, seed=1, noise=Noise(stolen_runs=0.3))
    recheck, _ = remeasured(server, "always")
    result = tune(
        server, TuneRequest(BUDGET_MS, grid=GRID, predict_s=2.0), ProbePlan(max_runs=5), recheck=recheck
    )
    saved = document(result, "recommender", "ours", server.policy, server.cores)
    assert saved.demoted and saved.noise.remeasured and saved.probe.cpu
    seconds = dataclasses.replace(saved.seconds, make_tune=saved.seconds.tuner + 5.0)
    raw = (RawPoint(1, 1.6, 625.0, 0.4), RawPoint(4, 1.9, 2100.0, 0.2))
    return dataclasses.replace(saved, seconds=seconds, raw=raw, buckets=(16, 64)).with_section(
        ["## Beside the tuner", "", "a section a tool rendered"]
    )


def rendered(saved: TuneDocument, folder: Path) -> str:
    """The report rendered from the document in memory (never written as ``result.json``)."""
    folder.mkdir()
    return report.render(folder, saved).read_text()


def test_a_tune_result_reads_back_as_written_and_renders_the_same_report(
    built: TuneDocument, tmp_path: Path
) -> None:
    folder = tmp_path / "saved"
    folder.mkdir()
    save(folder, built)
    back = load(folder)
    assert isinstance(back, TuneDocument) and back.operating == built.operating
    assert back.demoted == built.demoted and back.noise == built.noise and back.probe == built.probe
    assert back.raw == built.raw and back.buckets == (16, 64) and back.seconds.make_tune is not None
    from_file = report.render(folder).read_text()
    assert from_file == rendered(built, tmp_path / "built")
    assert "Reopened (a later run missed the budget" in from_file and "Raw backend" in from_file
    assert "(reopened)" in from_file and "measured (the highest rate a point held" in from_file
    assert from_file.rstrip().endswith("a section a tool rendered")
    assert "operating" in json.loads((folder / RESULT_FILE).read_text())  # the file's keys: the fields


def test_a_result_json_that_still_carries_a_dropped_figure_reads_back(
    built: TuneDocument, tmp_path: Path
) -> None:
    """A file written while runs and predictions still carried ``met_rate`` (nothing read it) loads as
    the same document: the keys a type no longer has are passed over, not refused."""
    save(tmp_path, built)
    data = json.loads((tmp_path / RESULT_FILE).read_text())
    older = [data["operating"]["measured"], data["operating"]["predicted"], *data["probe"]["runs"]]
    older += [c[key] for c in data["candidates"] for key in ("best", "at_rate") if c[key]]
    for figures in older:
        figures["met_rate"] = True
    (tmp_path / RESULT_FILE).write_text(json.dumps(data))
    assert load(tmp_path) == built


def test_a_field_of_the_wrong_type_is_refused_naming_it(built: TuneDocument, tmp_path: Path) -> None:
    save(tmp_path, built)
    data = json.loads((tmp_path / RESULT_FILE).read_text())
    data["operating"]["measured"]["sent"] = "many"
    (tmp_path / RESULT_FILE).write_text(json.dumps(data))
    with pytest.raises(OptionError, match=r"not a TuneDocument document: operating\.measured\.sent"):
        load(tmp_path)


def test_the_report_command_refuses_a_file_that_is_no_tune_result_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    (tmp_path / RESULT_FILE).write_text(json.dumps({"model": "recommender", "chosen": "max 8"}))
    assert report.main([str(tmp_path)]) == EXIT_USAGE == 2
    said = capsys.readouterr().err.strip()
    assert "\n" not in said and "not a TuneDocument document: budget_ms: Field required" in said
    assert not (tmp_path / "report.md").exists()
