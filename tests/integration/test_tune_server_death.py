"""A real tritonserver that dies during ``make tune`` (here killed by SIGSEGV, as a crash in
``libtriton_python.so`` kills it) is reported as such: exit status 1, never 3, a line saying the server
died and how, its log kept in the report folder (the next tune would overwrite the work folder's), and
``partial.md`` with what was measured before."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest
from rich.console import Console

from perf.cli import PerfSetup, main
from perf.errors import EXIT_RUNTIME
from perf.measure.engine import MeasureSettings
from perf.model.grid import Grid
from perf.session.probe import ProbePlan
from perf.tune.cli import TuneSetup
from perf.tune.tuner import tune

pytestmark = pytest.mark.integration
SPEC = Path(__file__).resolve().parents[2] / "models.yaml"
TINY = Grid(delays_us=(0,), max_batches=(8,), instances=(1,))


def test_a_server_killed_during_a_tune_exits_1_naming_its_death_and_keeping_its_log(
    tmp_path: Path, capsys: pytest.CaptureFixture, quick_windows: MeasureSettings
) -> None:
    killed: list[int] = []

    def tune_then_crash(server, request, plan=None, step=None, **kwargs):
        pid = server.server.pid

        def crash() -> None:
            killed.append(pid)
            os.kill(pid, signal.SIGSEGV)

        timer = threading.Timer(0.5, crash)  # during the probe's first reload or run
        timer.start()
        try:
            return tune(server, request, ProbePlan(max_runs=3), step, **kwargs)
        finally:
            timer.cancel()

    reports = tmp_path / "reports"
    code = main([
        "tune", "--spec", str(SPEC), "--model", "trivial", "--p99-ms", "50", "--engine", "ours",
        "--seconds", "0.9", "--reports", str(reports),
    ], PerfSetup(Console(width=400), tune=TuneSetup(
        quick_grid=TINY, workdir=tmp_path / "work", windows=quick_windows, tuner=tune_then_crash,
    )))  # fmt: skip
    assert killed, "the tune ended before the server was killed"
    assert code == EXIT_RUNTIME == 1
    printed = capsys.readouterr().out.replace("\n", " ")
    assert "tritonserver died during " in printed and "killed by SIGSEGV" in printed
    assert "nothing meets" not in printed
    (folder,) = reports.iterdir()
    kept = folder / "server.log"
    assert f"its log is kept in {kept}" in printed and kept.is_file() and kept.stat().st_size > 0
    partial = (folder / "partial.md").read_text()
    assert "**ServerDiedError**: tritonserver died during" in partial
    assert not (folder / "spec.tuned.yaml").exists()
